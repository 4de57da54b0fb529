// Package gpureq is Tessera's one model of a GPU request. The scheduler
// extender, the node agent's device plugins and NRI plugin, quota and the
// assignment checks all ask it the same questions and get the same answers:
//
//   - What a pod asks for (ParsePod): per container, whole GPUs
//     (tessera.dev/gpu) or a slice (tessera.dev/gpu-memory units,
//     tessera.dev/gpu-core percent) of one GPU, or split evenly over the
//     pod's tessera.dev/gpu-count GPUs (PerGPU, SharesPerGPU); a request
//     defaults to the limit. The pod
//     holds, at its peak, what the kubelet and kube-scheduler count
//     (KEP-753): regular containers and restartable init containers
//     (sidecars) add up, a regular init container runs alone beside the
//     sidecars started before it. CPU and memory come from
//     k8s.io/component-helpers' PodRequests (overhead and pod-level
//     resources included).
//   - What a slice is in MiB and cores on a node (Resolve, SlicePeak): its
//     memory units times the node's unit size; a core-only slice (cores, no
//     memory units) gets cores percent of the node's slice base
//     (CoreOnlyBaseMiB: the smallest shared capacity of the node's GPUs),
//     rounded up to a whole MiB. A memory-only slice (memory units, no
//     cores) has cores 0: no compute limit (no
//     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and no compute counted on its GPU.
//   - What a GPU shares out (GPUCapacity): its memory less the reserve,
//     floored to whole memory units (the devices the device plugin
//     advertises), and 100 cores.
//   - Cores in the allocator's milli units (CoresToMilli, UsedCoresToMilli).
//   - Whole and shared use of one GPU exclude each other (CheckWhole,
//     CheckShared), and a slice fits a GPU when the memory and cores in use
//     plus its own stay within the capacity (FitSlice).
//   - Whether a pod has ended (Terminal, Ended, EndedOn).
//   - Whether an assignment annotation fits the pod's requests
//     (CheckAssignment) and whether a shared assignment gives a container
//     no more than it holds (GrantSlice).
//   - What a pod counts against its namespace's quota (QuotaUse).
//   - Multi-GPU slices (multigpu.go): the even split, the GPU count
//     against the node (CheckCount), the MPS group rule (Groups: a GPU is
//     under one MPS daemon, whose clients all hold slices of all its GPUs)
//     and the choice of a slice's GPUs under it (ChooseGPUs).
//
// Every refusal is a *Refusal with a Code; callers format it, they do not
// decide again. The package does no I/O.
package gpureq
