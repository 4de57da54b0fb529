// Package kubeletstate reads from the kubelet which devices it has allocated
// to which containers: through its PodResources API (List), or, where that is
// not reachable, from the device manager's checkpoint file in the
// device-plugin directory. Either way the node agent rebuilds what is in use
// from the kubelet's own record, so nothing it knows lives only in its memory.
package kubeletstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/tessera-gpu/tessera/api"
)

// DefaultPodResourcesSocket is where the kubelet serves the PodResources API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// CheckpointFile is the name of the device manager's checkpoint in the
// device-plugin directory.
const CheckpointFile = "kubelet_internal_checkpoint"

// ContainerDevices is what the kubelet allocated to one container for one
// Tessera resource.
type ContainerDevices struct {
	// Namespace and Name identify the pod (PodResources only).
	Namespace, Name string
	// PodUID identifies the pod (checkpoint only).
	PodUID    string
	Container string
	Resource  corev1.ResourceName
	DeviceIDs []string
}

// ContainerKey names a container of a pod by namespace and name.
type ContainerKey struct {
	Namespace, Name, Container string
}

// Key returns the container's key; it is only meaningful for allocations
// from the PodResources API, which name pods.
func (c ContainerDevices) Key() ContainerKey {
	return ContainerKey{Namespace: c.Namespace, Name: c.Name, Container: c.Container}
}

// Source reads the kubelet's allocations of Tessera resources.
type Source interface {
	Allocations(ctx context.Context) ([]ContainerDevices, error)
	// Name says where the allocations come from, for logs.
	Name() string
}

// PodRef names a pod by namespace and name.
type PodRef struct{ Namespace, Name string }

// PodsLister is a Source that also tells which pods the kubelet lists:
// those it has admitted and not yet finished terminating, with devices or
// without.
type PodsLister interface {
	Source
	AllocationsAndPods(ctx context.Context) ([]ContainerDevices, []PodRef, error)
}

var _ PodsLister = (*PodResources)(nil)

// PodResources reads the kubelet's PodResources API.
type PodResources struct {
	// Socket is the kubelet's pod-resources socket.
	Socket string
	// Dial connects to Socket; a unix-socket dialer when nil.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Timeout bounds one List; 10s when zero.
	Timeout time.Duration
}

var _ Source = (*PodResources)(nil)

// Name implements Source.
func (p *PodResources) Name() string { return "PodResources API at " + p.Socket }

func (p *PodResources) timeout() time.Duration {
	if p.Timeout == 0 {
		return 10 * time.Second
	}
	return p.Timeout
}

// Connect returns a PodResources client of the kubelet at Socket and a
// function that closes it. Calls should be bounded by Timeout (Deadline).
func (p *PodResources) Connect() (podresourcesapi.PodResourcesListerClient, func(), error) {
	if _, err := os.Stat(p.Socket); err != nil && p.Dial == nil {
		return nil, nil, fmt.Errorf("kubelet PodResources socket: %w", err)
	}
	dial := p.Dial
	if dial == nil {
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}
	}
	conn, err := grpc.NewClient("passthrough:///"+p.Socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial))
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to the kubelet PodResources API at %s: %w", p.Socket, err)
	}
	return podresourcesapi.NewPodResourcesListerClient(conn), func() { conn.Close() }, nil
}

// Deadline bounds ctx by the Timeout of one call.
func (p *PodResources) Deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.timeout())
}

// Allocations implements Source with one List call.
func (p *PodResources) Allocations(ctx context.Context) ([]ContainerDevices, error) {
	out, _, err := p.AllocationsAndPods(ctx)
	return out, err
}

// AllocationsAndPods implements PodsLister with one List call.
func (p *PodResources) AllocationsAndPods(ctx context.Context) ([]ContainerDevices, []PodRef, error) {
	ctx, cancel := p.Deadline(ctx)
	defer cancel()
	client, done, err := p.Connect()
	if err != nil {
		return nil, nil, err
	}
	defer done()
	resp, err := client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("listing pod resources at %s: %w", p.Socket, err)
	}
	var out []ContainerDevices
	pods := make([]PodRef, 0, len(resp.GetPodResources()))
	for _, pod := range resp.GetPodResources() {
		pods = append(pods, PodRef{Namespace: pod.GetNamespace(), Name: pod.GetName()})
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				r := corev1.ResourceName(d.GetResourceName())
				if !api.IsTesseraResource(r) || len(d.GetDeviceIds()) == 0 {
					continue
				}
				out = append(out, ContainerDevices{
					Namespace: pod.GetNamespace(),
					Name:      pod.GetName(),
					Container: c.GetName(),
					Resource:  r,
					DeviceIDs: sorted(d.GetDeviceIds()),
				})
			}
		}
	}
	sortAllocations(out)
	return out, pods, nil
}

// WithInitContainers adds to allocs, what the PodResources API answered
// for the pods it listed (pods), the allocations of checkpoint (the device
// manager's checkpoint, which names pods by UID) of the containers of
// those pods that allocs names no device for: the regular (not
// restartable) init containers, which the PodResources API never lists,
// although the kubelet keeps their devices allocated to the pod until it
// ends and hands some of them on to the containers after them
// (devicemanager's devicesToReuse: an init container of 2 GPUs before an
// app container of 1 leaves the pod holding 2, of which PodResources
// names the app container's 1). uid gives a listed pod's UID ("": unknown,
// nothing is added for it): a checkpoint entry of another UID (a pod of
// the same name that went away) or of a pod not listed is left out. The
// entries added name their pod as PodResources does (Namespace and Name,
// no PodUID). allocs is not changed; the result is sorted.
func WithInitContainers(allocs []ContainerDevices, pods []PodRef, checkpoint []ContainerDevices, uid func(namespace, name string) string) []ContainerDevices {
	byUID := map[string]PodRef{}
	for _, p := range pods {
		if u := uid(p.Namespace, p.Name); u != "" {
			byUID[u] = p
		}
	}
	named := map[ContainerKey]bool{}
	for _, a := range allocs {
		named[a.Key()] = true
	}
	var more []ContainerDevices
	for _, c := range checkpoint {
		p, ok := byUID[c.PodUID]
		if !ok {
			continue
		}
		k := ContainerKey{Namespace: p.Namespace, Name: p.Name, Container: c.Container}
		if named[k] {
			continue
		}
		more = append(more, ContainerDevices{Namespace: p.Namespace, Name: p.Name, Container: c.Container, Resource: c.Resource, DeviceIDs: sorted(c.DeviceIDs)})
	}
	if len(more) == 0 {
		return allocs
	}
	out := append(append(make([]ContainerDevices, 0, len(allocs)+len(more)), allocs...), more...)
	sortAllocations(out)
	return out
}

// Checkpoint reads the kubelet device manager's checkpoint file.
type Checkpoint struct {
	// Path is the checkpoint file, normally
	// <device-plugin-dir>/kubelet_internal_checkpoint.
	Path string
}

var _ Source = (*Checkpoint)(nil)

// Name implements Source.
func (c *Checkpoint) Name() string { return "kubelet checkpoint " + c.Path }

// checkpointData mirrors the JSON of the device manager's checkpoint
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint).
type checkpointData struct {
	Data struct {
		PodDeviceEntries []struct {
			PodUID        string
			ContainerName string
			ResourceName  string
			// DeviceIDs is a map from NUMA node to IDs (v2), or a plain
			// list in checkpoints of kubelets before 1.20 (v1).
			DeviceIDs json.RawMessage
		}
		RegisteredDevices map[string][]string
	}
}

// Allocations implements Source. A missing file means nothing is allocated.
func (c *Checkpoint) Allocations(context.Context) ([]ContainerDevices, error) {
	b, err := os.ReadFile(c.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading kubelet checkpoint: %w", err)
	}
	return ParseCheckpoint(b, c.Path)
}

// ParseCheckpoint decodes a device manager checkpoint and returns its
// allocations of Tessera resources.
func ParseCheckpoint(b []byte, source string) ([]ContainerDevices, error) {
	var cp checkpointData
	if err := json.Unmarshal(b, &cp); err != nil {
		return nil, fmt.Errorf("kubelet checkpoint %s: %w", source, err)
	}
	var out []ContainerDevices
	for i, e := range cp.Data.PodDeviceEntries {
		r := corev1.ResourceName(e.ResourceName)
		if !api.IsTesseraResource(r) {
			continue
		}
		ids, err := deviceIDs(e.DeviceIDs)
		if err != nil {
			return nil, fmt.Errorf("kubelet checkpoint %s: PodDeviceEntries[%d].DeviceIDs: %w", source, i, err)
		}
		if len(ids) == 0 {
			continue
		}
		out = append(out, ContainerDevices{PodUID: e.PodUID, Container: e.ContainerName, Resource: r, DeviceIDs: ids})
	}
	sortAllocations(out)
	return out, nil
}

func deviceIDs(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var perNUMA map[string][]string
	if err := json.Unmarshal(raw, &perNUMA); err == nil {
		var ids []string
		for _, list := range perNUMA {
			ids = append(ids, list...)
		}
		return sortedUnique(ids), nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("neither a map of NUMA nodes to device IDs nor a list of IDs: %s", raw)
	}
	return sortedUnique(list), nil
}

// sortedUnique returns ids sorted, each once: a device listed twice (under
// two NUMA nodes, or twice in a v1 list) is allocated once.
func sortedUnique(ids []string) []string {
	out := sorted(ids)
	n := 0
	for i, id := range out {
		if i == 0 || id != out[n-1] {
			out[n] = id
			n++
		}
	}
	return out[:n]
}

// First reads the first source that answers.
type First []Source

var _ Source = First(nil)

// Name implements Source.
func (f First) Name() string {
	s := "first of"
	for _, x := range f {
		s += " [" + x.Name() + "]"
	}
	return s
}

// Allocations implements Source; it also returns the source that answered.
func (f First) Allocations(ctx context.Context) ([]ContainerDevices, error) {
	a, _, err := f.AllocationsFrom(ctx)
	return a, err
}

// AllocationsFrom is Allocations naming the source that answered.
func (f First) AllocationsFrom(ctx context.Context) ([]ContainerDevices, Source, error) {
	a, _, s, err := f.AllocationsPodsFrom(ctx)
	return a, s, err
}

// AllocationsPodsFrom is AllocationsFrom with the pods the source listed
// when it is a PodsLister (nil otherwise: unknown).
func (f First) AllocationsPodsFrom(ctx context.Context) ([]ContainerDevices, []PodRef, Source, error) {
	var errs []error
	for _, s := range f {
		var a []ContainerDevices
		var pods []PodRef
		var err error
		if pl, ok := s.(PodsLister); ok {
			a, pods, err = pl.AllocationsAndPods(ctx)
		} else {
			a, err = s.Allocations(ctx)
		}
		if err == nil {
			return a, pods, s, nil
		}
		errs = append(errs, err)
	}
	return nil, nil, nil, fmt.Errorf("no source of the kubelet's allocations answered: %w", errors.Join(errs...))
}

func sorted(ids []string) []string {
	out := append([]string(nil), ids...)
	sort.Strings(out)
	return out
}

func sortAllocations(a []ContainerDevices) {
	sort.Slice(a, func(i, j int) bool {
		x, y := a[i], a[j]
		if x.Namespace != y.Namespace {
			return x.Namespace < y.Namespace
		}
		if x.Name != y.Name {
			return x.Name < y.Name
		}
		if x.PodUID != y.PodUID {
			return x.PodUID < y.PodUID
		}
		if x.Container != y.Container {
			return x.Container < y.Container
		}
		return x.Resource < y.Resource
	})
}
