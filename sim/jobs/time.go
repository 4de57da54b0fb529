package jobs

import "time"

// unix turns a trace time (seconds) into a time.Time for quota's ordering.
func unix(sec int64) time.Time { return time.Unix(sec, 0).UTC() }
