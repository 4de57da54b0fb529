package nri

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MIGCaps are the driver's nvidia-caps character devices, through which it
// grants access to a MIG instance: a process needs the access device of the
// instance's GPU instance and of its compute instance
// (/dev/nvidia-caps/nvidia-cap<minor>). The CDI spec of a MIG device
// carries them; without CDI the NRI plugin adds them.
type MIGCaps struct {
	// Major is the nvidia-caps major (/proc/devices); 0 or less when
	// unknown: then no nvidia-caps node is added or ruled.
	Major int64
	// Minors maps the driver's names of the access capabilities,
	// "gpu<minor>/gi<id>/access" and "gpu<minor>/gi<id>/ci<id>/access"
	// (gpu<minor>: the GPU's /dev/nvidia<minor>), to their minors, as
	// /proc/driver/nvidia-caps/mig-minors lists them.
	Minors map[string]int64
}

// migMinorsFile is the driver's list of MIG capability minors under the
// proc root.
const migMinorsFile = "driver/nvidia-caps/mig-minors"

// ReadMIGCaps reads the nvidia-caps major from procRoot/devices and the
// MIG capability minors from procRoot/driver/nvidia-caps/mig-minors. A
// driver without them (no MIG support, or the files absent) yields an
// unknown major and no error.
func ReadMIGCaps(procRoot string) (MIGCaps, error) {
	caps := MIGCaps{Major: -1}
	major, err := charMajor(procRoot, "nvidia-caps")
	if err != nil || major < 0 {
		return caps, err
	}
	f, err := os.Open(filepath.Join(procRoot, migMinorsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return caps, nil
	}
	if err != nil {
		return caps, fmt.Errorf("reading MIG capability minors: %w", err)
	}
	defer f.Close()
	minors, err := ParseMIGMinors(f)
	if err != nil {
		return caps, fmt.Errorf("%s: %w", f.Name(), err)
	}
	return MIGCaps{Major: major, Minors: minors}, nil
}

// ParseMIGMinors parses the driver's mig-minors list: one "<name> <minor>"
// per line ("config 1", "monitor 2", "gpu0/gi1/access 12",
// "gpu0/gi1/ci0/access 13"). Blank lines are skipped; anything else, a
// minor that is not a non-negative number or a name listed twice, is an
// error naming the line.
func ParseMIGMinors(r io.Reader) (map[string]int64, error) {
	out := map[string]int64{}
	s := bufio.NewScanner(r)
	line := 0
	for s.Scan() {
		line++
		text := strings.TrimSpace(s.Text())
		if text == "" {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: %q is not \"<name> <minor>\"", line, text)
		}
		minor, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil || minor < 0 || minor > 1<<20 {
			return nil, fmt.Errorf("line %d: %q is not a device minor", line, fields[1])
		}
		if _, dup := out[fields[0]]; dup {
			return nil, fmt.Errorf("line %d: %s is listed twice", line, fields[0])
		}
		out[fields[0]] = minor
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// migCapNames are the names of the access capabilities of a MIG instance
// of the GPU with the given minor.
func migCapNames(gpuMinor int, in MIGInstance) []string {
	gi := fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, in.GPUInstanceID)
	ci := fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, in.GPUInstanceID, in.ComputeInstanceID)
	return []string{gi, ci}
}

// migCapNodes are the nvidia-caps device nodes of the MIG instances uuids:
// nil when the caps are unknown; an error when the driver lists no minor
// for one (the container could not use the instance: fail closed).
func migCapNodes(caps MIGCaps, node *Node, uuids []string) ([]DeviceNode, error) {
	if caps.Major <= 0 {
		return nil, nil
	}
	var out []DeviceNode
	seen := map[int64]bool{}
	for _, u := range uuids {
		g, in, ok := node.MIGInstance(u)
		if !ok {
			return nil, fmt.Errorf("MIG instance %s is not of this node", u)
		}
		for _, name := range migCapNames(g.Minor, in) {
			minor, ok := caps.Minors[name]
			if !ok {
				return nil, fmt.Errorf("the driver lists no nvidia-caps minor for %s (MIG instance %s)", name, u)
			}
			if !seen[minor] {
				seen[minor] = true
				out = append(out, DeviceNode{Path: "/dev/nvidia-caps/nvidia-cap" + strconv.FormatInt(minor, 10), Type: "c", Major: caps.Major, Minor: minor})
			}
		}
	}
	return out, nil
}
