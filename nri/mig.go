package nri

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tessera-gpu/tessera/api"
)

// MIGInstance returns the GPU and instance of a MIG UUID of the node.
func (n *Node) MIGInstance(uuid string) (GPU, MIGInstance, bool) {
	for _, g := range n.GPUs {
		for _, in := range g.MIG {
			if in.UUID == uuid {
				return g, in, true
			}
		}
	}
	return GPU{}, MIGInstance{}, false
}

// decideMIG checks the MIG instances the kubelet allocated to the
// container (on this node, of the resource's profile, not twice, their GPU
// healthy and in MIG mode, not another pod's) against the assignment's
// record of them when it has one, and returns them by GPU index and
// placement with their GPUs (each once, by index).
func decideMIG(node *Node, u usage, pod Pod, devs []MIGDevice, ca *api.ContainerAssignment) ([]api.MIGRef, []GPU, error) {
	type held struct {
		ref   api.MIGRef
		start int
	}
	var hs []held
	seen := map[string]bool{}
	for _, d := range devs {
		g, in, ok := node.MIGInstance(d.UUID)
		if !ok {
			return nil, nil, migError(d.UUID, "the kubelet allocated it as %s but it is not a MIG instance of this node", api.MIGResource(d.Profile))
		}
		if in.Profile != d.Profile {
			return nil, nil, migError(d.UUID, "the kubelet allocated it as %s but it is a %s instance", api.MIGResource(d.Profile), in.Profile)
		}
		if seen[d.UUID] {
			return nil, nil, migError(d.UUID, "allocated twice to the container")
		}
		seen[d.UUID] = true
		if !g.MIGMode {
			return nil, nil, migError(d.UUID, "its GPU %s is not in MIG mode", g.UUID)
		}
		if reason, bad := node.Unhealthy[g.UUID]; bad {
			return nil, nil, migError(d.UUID, "its GPU %s is unhealthy: %s", g.UUID, reason)
		}
		// The kubelet reuses an init container's devices for the app
		// containers of its pod.
		if e, used := u.mig[d.UUID]; used && e.PodUID != pod.UID {
			return nil, nil, migError(d.UUID, "already allocated to %s", e)
		}
		hs = append(hs, held{ref: api.MIGRef{UUID: in.UUID, Profile: in.Profile, GPU: api.GPURef{UUID: g.UUID, Index: g.Index}}, start: in.Start})
	}
	sort.Slice(hs, func(i, j int) bool {
		if hs[i].ref.GPU.Index != hs[j].ref.GPU.Index {
			return hs[i].ref.GPU.Index < hs[j].ref.GPU.Index
		}
		return hs[i].start < hs[j].start
	})
	var refs []api.MIGRef
	var gpus []GPU
	for _, h := range hs {
		refs = append(refs, h.ref)
		if len(gpus) == 0 || gpus[len(gpus)-1].UUID != h.ref.GPU.UUID {
			g, _ := node.GPU(h.ref.GPU.UUID)
			gpus = append(gpus, g)
		}
	}
	if ca != nil && len(ca.MIG) > 0 {
		if err := sameMIG(ca.MIG, refs); err != nil {
			return nil, nil, &DecisionError{Reason: fmt.Sprintf("the assignment annotation and the kubelet disagree on the container's MIG instances: %v", err)}
		}
	}
	return refs, gpus, nil
}

func migError(uuid, format string, args ...any) error {
	return &DecisionError{GPU: uuid, Reason: fmt.Sprintf(format, args...)}
}

// sameMIG checks that the assignment's MIG instances are the allocated
// ones, with the same profiles and GPUs.
func sameMIG(recorded, held []api.MIGRef) error {
	byUUID := map[string]api.MIGRef{}
	for _, r := range held {
		byUUID[r.UUID] = r
	}
	for _, r := range recorded {
		h, ok := byUUID[r.UUID]
		if !ok || len(recorded) != len(held) {
			return fmt.Errorf("annotation %s, kubelet %s", migList(recorded), migList(held))
		}
		if h != r {
			return fmt.Errorf("the annotation says %s is a %s of GPU %s (index %d), this node says a %s of GPU %s (index %d)", r.UUID, r.Profile, r.GPU.UUID, r.GPU.Index, h.Profile, h.GPU.UUID, h.GPU.Index)
		}
	}
	if len(recorded) != len(held) {
		return fmt.Errorf("annotation %s, kubelet %s", migList(recorded), migList(held))
	}
	return nil
}

func migList(refs []api.MIGRef) string {
	s := make([]string, len(refs))
	for i, r := range refs {
		s[i] = r.UUID
	}
	return "[" + strings.Join(s, ",") + "]"
}
