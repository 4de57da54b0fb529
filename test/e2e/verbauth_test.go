package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestVerbsNeedClientCert: the extender's verbs answer only kube-scheduler
// (its client certificate, --verbs-client-ca). A caller that reaches the
// extender's port without one, as any pod that reaches its Service could
// (make demo, an operator's report: curl -k -X POST .../bind bound a
// pending pod to the node it named, past the pod's nodeSelector), is
// refused with 403 and the pod stays unbound; /status still answers
// without a certificate, and kube-scheduler still schedules GPU pods.
func TestVerbsNeedClientCert(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-verbauth")
	client := c.Client()

	// A GPU pod no node may take: its nodeSelector names none.
	victim := create(t, client, ns, podSpec{name: "victim", gpus: 1, node: "no-such-node"})
	target := c.Nodes()[0].Name

	ca, err := os.ReadFile(c.ExtenderCAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("no certificate in the extender's CA file")
	}
	// The server is verified (curl -k would not even do that); no client
	// certificate.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	post := func(path string, body any) (int, string) {
		t.Helper()
		b, _ := json.Marshal(body)
		resp, err := hc.Post(c.ExtenderURL()+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	bind := map[string]any{"podName": victim.Name, "podNamespace": ns, "podUID": string(victim.UID), "node": target}
	podArgs := map[string]any{"pod": victim, "nodenames": []string{target}}
	for _, tc := range []struct {
		path string
		body any
	}{
		{"/bind", bind},
		{"/filter", podArgs},
		{"/prioritize", podArgs},
		{"/prioritize-cpu", podArgs},
		{"/preempt", map[string]any{"pod": victim, "nodeNameToMetaVictims": map[string]any{target: map[string]any{"pods": []any{}}}}},
	} {
		status, body := post(tc.path, tc.body)
		var reply map[string]string
		if status != http.StatusForbidden || json.Unmarshal([]byte(body), &reply) != nil || !strings.Contains(reply["error"], "client certificate") {
			t.Errorf("POST %s without a client certificate: %d %s, want 403 and a JSON error naming the client certificate", tc.path, status, body)
		}
	}

	// The pod stays unbound (a bind would have been done within the
	// request; give the informers time all the same).
	time.Sleep(3 * time.Second)
	p, err := client.CoreV1().Pods(ns).Get(t.Context(), victim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Errorf("pod %s was bound to %s by a caller without a client certificate", victim.Name, p.Spec.NodeName)
	}

	// The read-only views need no client certificate (the API server's
	// service proxy, kubectl tessera).
	resp, err := hc.Get(c.ExtenderURL() + "/status/occupancy")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /status/occupancy without a client certificate: %d, want 200", resp.StatusCode)
	}

	// kube-scheduler, with its certificate, still schedules GPU pods.
	create(t, client, ns, podSpec{name: "scheduled", gpus: 1})
	create(t, client, ns, podSpec{name: "slice", memUnits: 4, cores: 20})
	waitRunning(t, c, ns, "scheduled", 90*time.Second)
	waitRunning(t, c, ns, "slice", 90*time.Second)
}
