// Package consistency holds only a test: one table of GPU requests run
// through every component that judges them — the scheduler extender's fit
// (extender.ParseDemand, Filter, ChoosePlacement), the device plugin's
// Allocate checks (devices.Model.CheckWhole, CheckShared), the NRI plugin's
// decision (nri.Decide, with the extender's assignment and placed locally)
// and quota (extender/quota.Use, gpureq.QuotaUse) — which must agree on
// accept or refuse, on the refusal's gpureq.Code, and on the amounts. It
// fails when one component's rule drifts from package gpureq's. MIG
// requests (tessera.dev/mig-<profile>) run through the same components on
// the mock DGX A100 with MIG (mig_test.go), down to the extender counting
// the instances the node agent records on a bound pod.
package consistency
