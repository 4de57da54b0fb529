package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/install"
)

// The local cluster is installed as deploy/ says (framework/install): the
// admission policy guards Tessera's annotations, the extender serves its
// gang webhook and kube-scheduler over HTTPS, and both components run as
// their ServiceAccounts. This test checks that install end to end: the
// webhook gates a gang member created without the gate and the gang runs;
// the extender made the seal key through its Role; and Tessera's own
// writes pass the policy, sealed: the extender's slice assignment and gang
// plans, the node agent's whole-GPU assignment. (test/admission covers the
// policy's refusals in detail, TestTrustBoundary what forgeries achieve.)
func TestInstalledAsDeployed(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-install")
	client := c.Client()
	ctx := t.Context()

	// What deploy/admission holds is installed and bound.
	if _, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "tessera-state-annotations", metav1.GetOptions{}); err != nil {
		t.Errorf("admission policy: %v", err)
	}
	if b, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, "tessera-state-annotations", metav1.GetOptions{}); err != nil {
		t.Errorf("admission policy binding: %v", err)
	} else if len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != "Deny" {
		t.Errorf("binding's validation actions %v, want [Deny]", b.Spec.ValidationActions)
	}
	whc, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "tessera-gang", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("gang webhook: %v", err)
	}
	// The gang webhook fails closed (a member admitted without its gate
	// would run alone); the queue webhook fails open (docs/queues.md).
	wantPolicy := map[string]admissionregistrationv1.FailurePolicyType{"gang.tessera.dev": admissionregistrationv1.Fail, "queue.tessera.dev": admissionregistrationv1.Ignore}
	for _, w := range whc.Webhooks {
		want, known := wantPolicy[w.Name]
		if !known || w.ClientConfig.URL == nil || len(w.ClientConfig.CABundle) == 0 || w.FailurePolicy == nil || *w.FailurePolicy != want || len(w.MatchConditions) == 0 {
			t.Errorf("webhook %s: url %v, CA bundle %d bytes, failurePolicy %v (want %q), %d match conditions", w.Name, w.ClientConfig.URL, len(w.ClientConfig.CABundle), w.FailurePolicy, want, len(w.MatchConditions))
		}
		delete(wantPolicy, w.Name)
	}
	for name := range wantPolicy {
		t.Errorf("webhook %s is not installed", name)
	}

	// The extender created the seal key (deploy/extender's Role allows
	// that one create) and the cluster's components use it.
	secret, err := client.CoreV1().Secrets("kube-system").Get(ctx, api.SealKeySecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("seal key: %v", err)
	}
	sealer, err := api.NewSealer(secret.Data[api.SealKeyDataKey])
	if err != nil {
		t.Fatalf("seal key: %v", err)
	}
	if got := secret.ManagedFields; len(got) == 0 || got[0].Manager != "tessera-extender" {
		var managers []string
		for _, m := range got {
			managers = append(managers, m.Manager)
		}
		t.Errorf("seal key written by %v, want tessera-extender (running as %s)", managers, install.ExtenderUserName)
	}

	// A gang of two created without the gate: the webhook, over HTTPS,
	// gates both; the planner places them and they run.
	var members []*v1.Pod
	for i := range 2 {
		p := create(t, client, ns, podSpec{name: fmt.Sprintf("g-%d", i), gpus: 1,
			annotations: map[string]string{api.AnnotationGang: "g", api.AnnotationGangMinMember: "2"}})
		if !api.HasGangGate(p) {
			t.Fatalf("gang member %s created without the %s gate: the webhook did not run (gates %v)", p.Name, api.SchedulingGateGang, p.Spec.SchedulingGates)
		}
		members = append(members, p)
	}
	// A slice and a whole-GPU pod: the extender writes the slice's
	// assignment at bind, the node agent the whole-GPU pod's.
	create(t, client, ns, podSpec{name: "slice", memUnits: 4, cores: 20})
	create(t, client, ns, podSpec{name: "whole", gpus: 2})
	for _, name := range []string{members[0].Name, members[1].Name, "slice", "whole"} {
		p, _ := waitRunning(t, c, ns, name, 90*time.Second)
		// The node agent records a whole-GPU pod's GPUs once the kubelet
		// allocated them: wait for an assignment sealed for this pod.
		var last string
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			fresh, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || fresh.UID != p.UID {
				return false, fmt.Errorf("pod %s gone: %w", name, err)
			}
			a, found, err := sealer.Assignment(fresh.UID, fresh.Annotations)
			last = fmt.Sprintf("found=%v err=%v annotations=%v", found, err, fresh.Annotations)
			return found && err == nil && a.Container("main") != nil, nil
		})
		if err != nil {
			t.Errorf("pod %s: no assignment sealed for it: %v (%s)", name, err, last)
		}
	}
	for _, m := range members {
		p := getPod(t, client, ns, m.Name)
		if p == nil {
			t.Fatalf("gang member %s gone", m.Name)
		}
		if api.HasGangGate(p) {
			t.Errorf("gang member %s runs but still has the gate", p.Name)
		}
		if _, found, err := sealer.GangPlan(p.UID, p.Annotations); !found || err != nil {
			t.Errorf("gang member %s: sealed plan found=%v err=%v", p.Name, found, err)
		}
	}
}
