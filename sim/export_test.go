package sim

// SynthTrace is synthTrace for the tests of package sim_test.
var SynthTrace = synthTrace
