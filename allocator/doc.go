// Package allocator is the pure placement-policy core of Tessera.
//
// It takes plain data in and returns decisions out: no I/O, no NVML, no
// Kubernetes client, no package-level mutable state. Both the scheduler
// extender and the trace simulator (package sim) call it.
//
// The main pieces are:
//
//   - Node / GPU / Request: a snapshot of one node and one pod's request.
//     A request asks for CPU and memory plus either N whole GPUs or one
//     shared slice of a single GPU (compute milli and/or GPU memory).
//   - Fit: whether a request fits a node, with a typed Reason when it does not.
//   - Policy: scores a node for a request (higher is better) and picks the
//     GPU(s) inside the node. NewPolicy builds one by name: random, dotprod,
//     gpuclustering, gpupacking, bestfit, fgd (the six policies of the FGD
//     paper, USENIX ATC'23, implemented as in its artifact), spread
//     (least-allocated) and tessera (our fragmentation-aware policy).
//   - Apply / Release: account a placement on a node snapshot.
//   - Workload: the "target workload" (pod shapes and their popularity) that
//     fragmentation-aware policies need, as plain data.
//   - Select: pick the best node of a cluster for a request, with an explicit
//     tie-break rank.
package allocator
