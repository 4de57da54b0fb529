package nri

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/tessera-gpu/tessera/api"
)

// LedgerFile is the ledger's checkpoint in the state directory.
const LedgerFile = "nri-ledger.json"

// KindLedger is the kind of the ledger checkpoint.
const KindLedger = "NodeGPULedger"

type ledgerFile struct {
	APIVersion string  `json:"apiVersion"`
	Kind       string  `json:"kind"`
	Entries    []Entry `json:"entries"`
}

// Ledger is the node's record of which container uses which GPU or GPU
// slice. Every change is checkpointed to a file (written to a temporary file
// and renamed over the old one) before it is visible, so a restarted agent
// rebuilds the same ledger. It is safe for concurrent use.
type Ledger struct {
	path string

	mu      sync.Mutex
	entries map[Key]Entry
	// onChange, when set, is called (outside mu) after every change.
	onChange func()
}

// OpenLedger reads the ledger checkpointed in dir, or starts an empty one
// when there is none. A checkpoint that cannot be read is an error: the
// agent must not forget what is in use.
func OpenLedger(dir string) (*Ledger, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ledger state directory: %w", err)
	}
	l := &Ledger{path: filepath.Join(dir, LedgerFile), entries: map[Key]Entry{}}
	b, err := os.ReadFile(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the ledger checkpoint: %w", err)
	}
	var f ledgerFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("ledger checkpoint %s: %w", l.path, err)
	}
	if f.APIVersion != api.Version || f.Kind != KindLedger {
		return nil, fmt.Errorf("ledger checkpoint %s: want %s %s, got %s %s", l.path, api.Version, KindLedger, f.APIVersion, f.Kind)
	}
	for _, e := range f.Entries {
		l.entries[e.Key()] = e
	}
	return l, nil
}

// Path is the checkpoint file.
func (l *Ledger) Path() string { return l.path }

// Snapshot returns the entries ordered by namespace, pod and container.
func (l *Ledger) Snapshot() []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sortedLocked()
}

func (l *Ledger) sortedLocked() []Entry {
	out := make([]Entry, 0, len(l.entries))
	for _, e := range l.entries {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Pod != b.Pod {
			return a.Pod < b.Pod
		}
		if a.PodUID != b.PodUID {
			return a.PodUID < b.PodUID
		}
		return a.Container < b.Container
	})
	return out
}

// OnChange sets f to be called after every change of the entries, outside
// the ledger's lock; nil calls nothing.
func (l *Ledger) OnChange(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onChange = f
}

// GPUsInUse returns the UUIDs of the GPUs that the recorded containers use
// whole and those they use shared (every GPU of a multi-GPU slice). The
// entries are the containers that exist in the runtime, so this holds
// while the API server and the kubelet no longer know a container's pod:
// after a forced deletion, its container runs on until the kubelet has
// killed it.
func (l *Ledger) GPUsInUse() (whole, shared map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	whole, shared = map[string]bool{}, map[string]bool{}
	for _, e := range l.entries {
		for _, g := range e.GPUs {
			whole[g.UUID] = true
		}
		if e.Shared != nil {
			for _, uuid := range e.Shared.UUIDs() {
				shared[uuid] = true
			}
		}
	}
	return whole, shared
}

// Put records e, replacing the entry of the same key.
func (l *Ledger) Put(e Entry) error {
	return l.update(func(m map[Key]Entry) bool {
		m[e.Key()] = e
		return true
	})
}

// RemoveContainer frees the entry of a container, unless a newer container
// of the same name (another runtime ID) has replaced it.
func (l *Ledger) RemoveContainer(podUID, name, id string) error {
	return l.update(func(m map[Key]Entry) bool {
		k := Key{PodUID: podUID, Container: name}
		e, ok := m[k]
		if !ok || (id != "" && e.ContainerID != id) {
			return false
		}
		delete(m, k)
		return true
	})
}

// RemovePod frees every entry of a pod.
func (l *Ledger) RemovePod(podUID string) error {
	return l.update(func(m map[Key]Entry) bool {
		changed := false
		for k := range m {
			if k.PodUID == podUID {
				delete(m, k)
				changed = true
			}
		}
		return changed
	})
}

// Retain keeps the entries for which keep is true and frees the others.
func (l *Ledger) Retain(keep func(Entry) bool) error {
	return l.update(func(m map[Key]Entry) bool {
		changed := false
		for k, e := range m {
			if !keep(e) {
				delete(m, k)
				changed = true
			}
		}
		return changed
	})
}

// update applies change to a copy of the entries and, when it reports a
// change, checkpoints the copy before making it current.
func (l *Ledger) update(change func(map[Key]Entry) bool) error {
	changed, notify, err := l.updateLocked(change)
	if changed && notify != nil {
		notify()
	}
	return err
}

func (l *Ledger) updateLocked(change func(map[Key]Entry) bool) (bool, func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := make(map[Key]Entry, len(l.entries))
	for k, e := range l.entries {
		next[k] = e
	}
	if !change(next) {
		return false, nil, nil
	}
	old := l.entries
	l.entries = next
	if err := l.checkpointLocked(); err != nil {
		l.entries = old
		return false, nil, err
	}
	return true, l.onChange, nil
}

func (l *Ledger) checkpointLocked() error {
	f := ledgerFile{APIVersion: api.Version, Kind: KindLedger, Entries: l.sortedLocked()}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the ledger: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(l.path), "."+LedgerFile+".*")
	if err != nil {
		return fmt.Errorf("checkpointing the ledger: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpointing the ledger: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpointing the ledger: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("checkpointing the ledger: %w", err)
	}
	if err := os.Rename(tmp.Name(), l.path); err != nil {
		return fmt.Errorf("checkpointing the ledger: %w", err)
	}
	return nil
}
