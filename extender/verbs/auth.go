package verbs

import (
	"net/http"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// ErrNoClientCert is the error a verb called without a verified client
// certificate is answered with (403).
const ErrNoClientCert = "tessera-extender: the scheduler verbs need a client certificate signed by the extender's --verbs-client-ca (kube-scheduler's tlsConfig certFile/keyFile)"

// refusalLogEvery bounds how often refused calls are logged at the default
// verbosity (each one is logged at V(2)).
const refusalLogEvery = 10 * time.Second

// RequireClientCert answers 403 with a JSON error (ErrorReply) to every
// request that did not come over TLS with a client certificate the server
// verified, and hands the others to next. It authenticates the caller of
// the verbs: TLS alone only authenticates the server, and a verb binds,
// places or evicts pods. The server must verify the certificates it is
// given (tls.Config ClientCAs with VerifyClientCertIfGiven or
// RequireAndVerifyClientCert): this only checks that one was verified.
//
// Refusals are logged with the remote address: the first, then at most
// one per 10 s with the count of those left out meanwhile; each at V(2).
func RequireClientCert(next http.Handler) http.Handler {
	var (
		mu      sync.Mutex
		last    time.Time
		dropped int
	)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			next.ServeHTTP(w, r)
			return
		}
		ctx := r.Context()
		logger := klog.FromContext(ctx)
		mu.Lock()
		now := time.Now()
		show := now.Sub(last) >= refusalLogEvery
		left := dropped
		if show {
			last, dropped = now, 0
		} else {
			dropped++
		}
		mu.Unlock()
		if show {
			logger.Info("Refused a scheduler verb without a verified client certificate", "path", r.URL.Path, "remote", r.RemoteAddr, "tls", r.TLS != nil, "refusedSinceLastLog", left)
		} else {
			logger.V(2).Info("Refused a scheduler verb without a verified client certificate", "path", r.URL.Path, "remote", r.RemoteAddr, "tls", r.TLS != nil)
		}
		WriteJSON(ctx, w, http.StatusForbidden, &ErrorReply{Error: ErrNoClientCert})
	})
}
