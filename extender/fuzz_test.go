package extender_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
)

// demandInput is one fuzzed pod: a main container, an init container (a
// sidecar when restartable), the pod overhead and the scheduling
// annotations. Quantities that do not parse are left out, as the API server
// would refuse them.
type demandInput struct {
	gpu, mem, cores, cpu, memory                     string
	initGPU, initMem, initCores, initCPU, initMemory string
	sidecar                                          bool
	overheadCPU, overheadMem                         string
	model, nvlink                                    string
	hasModel, hasNVLink                              bool
}

var hugeExponent = regexp.MustCompile(`[eE][+-]?\d{4,}`)

func (in demandInput) pod() (pod *corev1.Pod, nonNegative bool) {
	nonNegative = true
	set := func(l corev1.ResourceList, name corev1.ResourceName, v string) {
		// A decimal exponent of more than three digits takes apimachinery
		// tens of seconds to parse ("9223372036E54775807"): the harness's
		// own cost, not ParseDemand's, so such inputs are not built.
		if v == "" || hugeExponent.MatchString(v) {
			return
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return
		}
		if q.Sign() < 0 {
			nonNegative = false
		}
		l[name] = q
	}
	container := func(name, gpu, mem, cores, cpu, memory string) corev1.Container {
		c := corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}}
		set(c.Resources.Limits, api.ResourceGPU, gpu)
		set(c.Resources.Limits, api.ResourceGPUMemory, mem)
		set(c.Resources.Limits, api.ResourceGPUCore, cores)
		set(c.Resources.Requests, corev1.ResourceCPU, cpu)
		set(c.Resources.Requests, corev1.ResourceMemory, memory)
		return c
	}
	pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Annotations: map[string]string{}},
		Spec: corev1.PodSpec{
			Containers:     []corev1.Container{container("main", in.gpu, in.mem, in.cores, in.cpu, in.memory)},
			InitContainers: []corev1.Container{container("init", in.initGPU, in.initMem, in.initCores, in.initCPU, in.initMemory)},
			Overhead:       corev1.ResourceList{},
		},
	}
	if in.sidecar {
		always := corev1.ContainerRestartPolicyAlways
		pod.Spec.InitContainers[0].RestartPolicy = &always
	}
	set(pod.Spec.Overhead, corev1.ResourceCPU, in.overheadCPU)
	set(pod.Spec.Overhead, corev1.ResourceMemory, in.overheadMem)
	if in.hasModel {
		pod.Annotations[api.AnnotationGPUModel] = in.model
	}
	if in.hasNVLink {
		pod.Annotations[api.AnnotationNVLink] = in.nvlink
	}
	return pod, nonNegative
}

// FuzzParseDemand: ParseDemand of any pod either fails with
// ErrInvalidDemand (naming the annotation when one is malformed) or returns
// a demand a node could serve: whole GPUs or one shared slice, at most one
// GPU of cores, no negative amount, and allocator requests within bounds.
func FuzzParseDemand(f *testing.F) {
	for _, in := range []demandInput{
		{cpu: "2"},
		{mem: "8", cores: "30"},
		{cores: "50"},
		{gpu: "4", model: "A100|H100", hasModel: true, nvlink: "required", hasNVLink: true},
		{mem: "1", nvlink: "required", hasNVLink: true},
		{gpu: "2", initGPU: "3"},
		{gpu: "2", initGPU: "3", sidecar: true},
		{gpu: "1", mem: "1"},
		{cores: "150"},
		{cores: "60", initCores: "60", sidecar: true},
		{gpu: "1", model: "A100||H100", hasModel: true},
		{gpu: "2", nvlink: "maybe", hasNVLink: true},
		{gpu: "500m"},
		{gpu: "-1"},
		{gpu: "65"},
		{cpu: "100m", memory: "1Gi", overheadCPU: "250m", overheadMem: "120Mi"},
		{memory: "8E", initMemory: "8E", overheadMem: "8E"},
		{cpu: "9223372036854775807", overheadCPU: "9223372036854775807"},
		{gpu: "1e3", mem: "1Ki"},
	} {
		f.Add(in.gpu, in.mem, in.cores, in.cpu, in.memory, in.initGPU, in.initMem, in.initCores, in.initCPU, in.initMemory,
			in.sidecar, in.overheadCPU, in.overheadMem, in.model, in.nvlink, in.hasModel, in.hasNVLink)
	}
	f.Fuzz(func(t *testing.T, gpu, mem, cores, cpu, memory, initGPU, initMem, initCores, initCPU, initMemory string,
		sidecar bool, overheadCPU, overheadMem, model, nvlink string, hasModel, hasNVLink bool) {
		in := demandInput{gpu, mem, cores, cpu, memory, initGPU, initMem, initCores, initCPU, initMemory,
			sidecar, overheadCPU, overheadMem, model, nvlink, hasModel, hasNVLink}
		pod, nonNegative := in.pod()
		d, err := extender.ParseDemand(pod)
		if err != nil {
			if !errors.Is(err, extender.ErrInvalidDemand) {
				t.Fatalf("error %v does not wrap ErrInvalidDemand", err)
			}
			if _, merr := api.GetGPUModels(pod.Annotations); merr != nil && !strings.Contains(err.Error(), api.AnnotationGPUModel) {
				t.Fatalf("error %v does not name %s", err, api.AnnotationGPUModel)
			}
			if _, nerr := api.GetNVLinkRequired(pod.Annotations); nerr != nil && !strings.Contains(err.Error(), api.AnnotationNVLink) && !strings.Contains(err.Error(), api.AnnotationGPUModel) {
				t.Fatalf("error %v does not name %s", err, api.AnnotationNVLink)
			}
			return
		}
		models, _ := api.GetGPUModels(pod.Annotations)
		if !cmp.Equal(models, d.Models) {
			t.Fatalf("models %v, annotation gives %v", d.Models, models)
		}
		if d.WholeGPUs < 0 || d.WholeGPUs > allocator.MaxGPUsPerNode || (d.WholeGPUs > 0 && len(d.Shares) > 0) || (d.NVLink && d.WholeGPUs == 0) {
			t.Fatalf("demand %+v", d)
		}
		// Shares that run at once (the main container and a sidecar; a
		// plain init container runs alone) fit one GPU's cores.
		var running int64
		for _, s := range d.Shares {
			if s.MemUnits < 0 || s.Cores < 0 || s.Cores > api.CoresPerGPU || (s.MemUnits == 0 && s.Cores == 0) {
				t.Fatalf("share %+v", s)
			}
			if s.Name == "main" || (s.Name == "init" && sidecar) {
				running += s.Cores
			}
		}
		if running > api.CoresPerGPU {
			t.Fatalf("shares %+v run at once with %d cores", d.Shares, running)
		}
		if nonNegative && (d.CPUMilli < 0 || d.MemMiB < 0) {
			t.Fatalf("non-negative requests give CPU %dm, memory %d MiB: a quantity beyond int64 wrapped around (convert with saturation)", d.CPUMilli, d.MemMiB)
		}
		r := d.Request(1024, 40960)
		if r.GPUs != d.WholeGPUs || r.GPUMemMiB < 0 || r.GPUMilli < 0 || r.GPUMilli >= allocator.MilliPerGPU {
			t.Fatalf("allocator request %+v of %+v", r, d)
		}
		switch k := d.Kind(); {
		case d.WholeGPUs > 0 && k != allocator.Whole, len(d.Shares) > 0 && k != allocator.Shared, d.WholeGPUs == 0 && len(d.Shares) == 0 && k != allocator.CPUOnly:
			t.Fatalf("kind %v of %+v", k, d)
		}
	})
}
