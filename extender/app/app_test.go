package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

func TestRunRejectsBadFlags(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"tls cert without key", []string{"--tls-cert=x"}, "go together"},
		{"unknown policy", []string{"--policy=nope", "--kubeconfig=/nonexistent"}, allocator.ErrUnknownPolicy.Error()},
		{"missing kubeconfig", []string{"--kubeconfig=/nonexistent/kubeconfig"}, "kubeconfig"},
		{"stray argument", []string{"extra"}, "unexpected arguments"},
		{"bad gang level mode", []string{"--gang-levels=rack:maybe"}, "neither required nor preferred"},
		{"repeated gang level", []string{"--gang-levels=rack,rack"}, "empty or repeated"},
		{"zero gang resync", []string{"--gang-resync=0s"}, "must be positive"},
		{"zero gang timeout max", []string{"--gang-timeout-max=0s"}, "--gang-timeout-max must be positive, at least 1s (gang timeouts are whole seconds), got 0s"},
		{"zero quota CRD retry", []string{"--quota-crd-retry=0s"}, "must be positive, got 0s, 2m0s and 2s"},
		{"negative reclaim hold", []string{"--quota-reclaim-hold=-1s"}, "must be positive, got 30s, -1s and 2s"},
		{"zero quota resync", []string{"--quota-resync=0s"}, "must be positive, got 30s, 2m0s and 0s"},
		{"negative shortlist", []string{"--filter-shortlist=-1"}, "--filter-shortlist must be 0 (off) or positive, got -1"},
		{"verbs client CA over plain HTTP", []string{"--verbs-client-ca=ca.crt"}, "--verbs-client-ca needs --tls-cert and --tls-key"},
		{"verbs client CA unreadable", []string{"--tls-cert=x", "--tls-key=y", "--verbs-client-ca=/nonexistent/ca.crt", "--kubeconfig=/nonexistent"}, "--verbs-client-ca: open /nonexistent/ca.crt"},
		{"verbs client CA without a certificate", []string{"--tls-cert=x", "--tls-key=y", "--verbs-client-ca=" + notPEM, "--kubeconfig=/nonexistent"}, "--verbs-client-ca: no PEM certificate in " + notPEM},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), tc.args, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%v) = %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
	if err := Run(context.Background(), []string{"--help"}, io.Discard, nil); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v, want flag.ErrHelp", err)
	}
}

func TestQuotaFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.quota || o.quotaRetry != 30*time.Second || o.quotaHold != 2*time.Minute {
		t.Errorf("defaults: quota %v, retry %s, hold %s; want on, 30s, 2m", o.quota, o.quotaRetry, o.quotaHold)
	}
	o, err = parseFlags([]string{"--quota=false", "--quota-crd-retry=5s", "--quota-reclaim-hold=10s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.quota || o.quotaRetry != 5*time.Second || o.quotaHold != 10*time.Second {
		t.Errorf("set: quota %v, retry %s, hold %s", o.quota, o.quotaRetry, o.quotaHold)
	}
}

func TestReservationFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.reserveBackfill || !o.reservePreemptible || o.reserveMinGPUs != 1 || o.reservePerGPU != 0 || o.reserveRelative != 0 {
		t.Errorf("defaults: backfill %v, preemptible %v, min GPUs %d, per GPU %s, relative %v", o.reserveBackfill, o.reservePreemptible, o.reserveMinGPUs, o.reservePerGPU, o.reserveRelative)
	}
	o, err = parseFlags([]string{"--reservation-backfill=false", "--reservation-preemptible=false", "--reservation-min-gpus=16", "--reservation-wait-per-gpu=1m", "--reservation-relative=0.5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.reserveBackfill || o.reservePreemptible || o.reserveMinGPUs != 16 || o.reservePerGPU != time.Minute || o.reserveRelative != 0.5 {
		t.Errorf("set: %+v", o)
	}
	for _, bad := range []string{"--reservation-min-gpus=-1", "--reservation-wait-per-gpu=-1s", "--reservation-relative=-0.5"} {
		if _, err := parseFlags([]string{bad}, io.Discard); err == nil {
			t.Errorf("%s was accepted", bad)
		}
	}
}

func TestConsolidationFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.consolidation || o.consolidationPerMinute != 4 {
		t.Errorf("defaults: consolidation %v, moves per minute %d; want off, 4", o.consolidation, o.consolidationPerMinute)
	}
	o, err = parseFlags([]string{"--consolidation", "--consolidation-moves-per-minute=10"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.consolidation || o.consolidationPerMinute != 10 {
		t.Errorf("set: consolidation %v, moves per minute %d", o.consolidation, o.consolidationPerMinute)
	}
	for _, bad := range []string{"--consolidation-moves-per-minute=0", "--consolidation-moves-per-minute=-1"} {
		if _, err := parseFlags([]string{bad}, io.Discard); err == nil {
			t.Errorf("%s was accepted", bad)
		}
	}
}

// TestGangTimeoutMaxFlag: the operator's bound on a gang's timeout
// (planner.GangTimeout) defaults to 30m, at least the default timeout.
func TestGangTimeoutMaxFlag(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.gangTimeoutMax != 30*time.Minute || o.gangTimeoutMax < api.DefaultGangTimeout {
		t.Errorf("default --gang-timeout-max %s, want 30m (not below the default timeout %s)", o.gangTimeoutMax, api.DefaultGangTimeout)
	}
	for good, want := range map[string]time.Duration{"1s": time.Second, "5m": 5 * time.Minute, "2h": 2 * time.Hour} {
		o, err := parseFlags([]string{"--gang-timeout-max=" + good}, io.Discard)
		if err != nil {
			t.Errorf("--gang-timeout-max=%s: %v", good, err)
		} else if o.gangTimeoutMax != want {
			t.Errorf("--gang-timeout-max=%s: %s, want %s", good, o.gangTimeoutMax, want)
		}
	}
	for _, bad := range []string{"0s", "-1m", "500ms", "30"} {
		if _, err := parseFlags([]string{"--gang-timeout-max=" + bad}, io.Discard); err == nil || !strings.Contains(err.Error(), "gang-timeout-max") {
			t.Errorf("--gang-timeout-max=%s: %v, want it refused", bad, err)
		}
	}
}

func TestQueueHistoryWeightFlag(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.queueHistoryWt != 1 {
		t.Errorf("default --queue-history-weight %v, want 1", o.queueHistoryWt)
	}
	for _, good := range []string{"0", "0.5", "3"} {
		if _, err := parseFlags([]string{"--queue-history-weight=" + good}, io.Discard); err != nil {
			t.Errorf("--queue-history-weight=%s: %v", good, err)
		}
	}
	for _, bad := range []string{"-1", "NaN", "+Inf"} {
		if _, err := parseFlags([]string{"--queue-history-weight=" + bad}, io.Discard); err == nil || !strings.Contains(err.Error(), "--queue-history-weight") {
			t.Errorf("--queue-history-weight=%s: %v, want it refused", bad, err)
		}
	}
}

func writeSelfSigned(t *testing.T, dir string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

// TestServesTLSAndRefusesVerbsUntilSynced runs the command against an API
// server that does not answer: it serves HTTPS, is healthy, is not ready,
// answers verbs with a JSON 503, and shuts down cleanly.
func TestServesTLSAndRefusesVerbsUntilSynced(t *testing.T) {
	addr := startUnsynced(t, nil, nil)
	hc := insecureClient()
	resp, err := hc.Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("healthz over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz: %d", resp.StatusCode)
	}
	if resp, err := hc.Get("https://" + addr + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("readyz before sync: %v %v, want 503", resp, err)
	} else {
		resp.Body.Close()
	}
	resp, err = hc.Post("https://"+addr+"/filter", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var reply map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil || resp.StatusCode != http.StatusServiceUnavailable || reply["error"] == "" {
		t.Errorf("filter before sync: status %d, reply %v (%v), want a JSON 503", resp.StatusCode, reply, err)
	}
	resp.Body.Close()
	// The gang admission webhook needs no cache: it answers before sync
	// (here: refusing a review without a request).
	resp, err = hc.Post("https://"+addr+"/admission/gang", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	reply = nil
	if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil || resp.StatusCode != http.StatusBadRequest || !strings.Contains(reply["error"], "without a request") {
		t.Errorf("admission webhook before sync: status %d, reply %v (%v), want the webhook's 400", resp.StatusCode, reply, err)
	}
	resp.Body.Close()
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP served on a TLS listener")
		}
	}
	// startUnsynced's cleanup cancels the run and checks it returns.
}

// insecureClient is an HTTPS client of the self-signed test server,
// presenting certs.
func insecureClient(certs ...tls.Certificate) *http.Client {
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: certs}}} //nolint:gosec // self-signed test server
}

// startUnsynced runs the command over HTTPS against an API server that
// does not answer (it never becomes ready) until the test ends, and
// returns its address once /healthz answers.
func startUnsynced(t *testing.T, extra []string, embed func(Embedded)) string {
	t.Helper()
	dir := t.TempDir()
	cert, key := writeSelfSigned(t, dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	args := append([]string{"--kubeconfig=" + kubeconfig, "--listen=" + addr, "--tls-cert=" + cert, "--tls-key=" + key, "--shutdown-grace=2s"}, extra...)
	go func() { done <- Run(ctx, args, io.Discard, embed) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run() after shutdown: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("run() did not return after cancel")
		}
	})
	hc := insecureClient()
	for i := 0; i < 100; i++ {
		var resp *http.Response
		if resp, err = hc.Get("https://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			return addr
		}
		select {
		case err := <-done:
			t.Fatalf("run() returned before serving: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("healthz over TLS: %v", err)
	return ""
}

// TestVerbsNeedClientCert: with --verbs-client-ca, every verb answers a
// caller without a client certificate of that CA 403 (before the caches
// sync too), one with a certificate reaches the verbs (here: 503, not
// synced), and the webhooks, /healthz, /readyz and /status answer without
// one.
func TestVerbsNeedClientCert(t *testing.T) {
	ca := testbuild.NewCA(t, "verbs-ca")
	caPath := filepath.Join(t.TempDir(), "verbs-ca.crt")
	ca.WriteCert(t, caPath)
	client := ca.Client(t)
	addr := startUnsynced(t, []string{"--verbs-client-ca=" + caPath}, nil)
	anon, sched := insecureClient(), insecureClient(client)

	tests := []struct {
		name   string
		client *http.Client
		method string
		path   string
		status int
	}{
		{"filter without a certificate", anon, http.MethodPost, "/filter", http.StatusForbidden},
		{"prioritize without a certificate", anon, http.MethodPost, "/prioritize", http.StatusForbidden},
		{"prioritize-cpu without a certificate", anon, http.MethodPost, "/prioritize-cpu", http.StatusForbidden},
		{"bind without a certificate", anon, http.MethodPost, "/bind", http.StatusForbidden},
		{"preempt without a certificate", anon, http.MethodPost, "/preempt", http.StatusForbidden},
		{"filter with kube-scheduler's certificate", sched, http.MethodPost, "/filter", http.StatusServiceUnavailable},
		{"bind with kube-scheduler's certificate", sched, http.MethodPost, "/bind", http.StatusServiceUnavailable},
		{"gang webhook without a certificate", anon, http.MethodPost, pathAdmissionGang, http.StatusBadRequest},
		{"healthz without a certificate", anon, http.MethodGet, "/healthz", http.StatusOK},
		{"readyz without a certificate", anon, http.MethodGet, "/readyz", http.StatusServiceUnavailable},
		{"status without a certificate", anon, http.MethodGet, "/status/occupancy", http.StatusServiceUnavailable},
		{"metrics without a certificate", anon, http.MethodGet, "/metrics", http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "https://"+addr+tc.path, strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := tc.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, resp.StatusCode, body, tc.status)
			}
			if tc.status == http.StatusForbidden {
				var reply map[string]string
				if err := json.Unmarshal(body, &reply); err != nil || !strings.Contains(reply["error"], "client certificate") {
					t.Errorf("reply %s (%v), want a JSON error naming the client certificate", body, err)
				}
			}
		})
	}
}

// TestEmbeddedServesNoVerbs: run in tessera-scheduler's process (embed not
// nil), the extender serves no verb over HTTP, but its webhooks and
// health as alone.
func TestEmbeddedServesNoVerbs(t *testing.T) {
	var embedded atomic.Bool
	addr := startUnsynced(t, nil, func(e Embedded) { embedded.Store(e.Server != nil && e.Ready != nil) })
	if !embedded.Load() {
		t.Error("embed was not called with the Server")
	}
	hc := insecureClient()
	tests := []struct {
		method, path string
		status       int
	}{
		{http.MethodPost, "/filter", http.StatusNotFound},
		{http.MethodPost, "/prioritize", http.StatusNotFound},
		{http.MethodPost, "/prioritize-cpu", http.StatusNotFound},
		{http.MethodPost, "/bind", http.StatusNotFound},
		{http.MethodPost, "/preempt", http.StatusNotFound},
		{http.MethodPost, pathAdmissionGang, http.StatusBadRequest},
		{http.MethodGet, "/healthz", http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "https://"+addr+tc.path, strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
			}
		})
	}
}
