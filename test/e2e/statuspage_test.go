package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/internal/gpustatus"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// chromium returns the headless browser the status page test drives:
// $TESSERA_TEST_CHROMIUM or chromium on PATH (make test-chromium installs
// Debian's). Without it the test fails under CI=true and is skipped,
// saying so, elsewhere.
func chromium(t *testing.T) string {
	t.Helper()
	name := os.Getenv("TESSERA_TEST_CHROMIUM")
	if name == "" {
		name = "chromium"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		msg := fmt.Sprintf("no headless browser: %v (make test-chromium installs Debian's chromium)", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// extenderEndpoint returns the running extender's base URL and an HTTPS
// client that trusts its CA, as the cluster knows them: the gang webhook
// of deploy/extender/webhook.yaml points at the extender with its CA.
func extenderEndpoint(t *testing.T, c *nodesim.Cluster) (string, *http.Client) {
	t.Helper()
	wh, err := c.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), "tessera-gang", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the extender's webhook configuration: %v", err)
	}
	for _, w := range wh.Webhooks {
		cc := w.ClientConfig
		if cc.URL == nil || !strings.HasSuffix(*cc.URL, "/admission/gang") {
			continue
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cc.CABundle) {
			t.Fatal("the extender's caBundle is not PEM")
		}
		return strings.TrimSuffix(*cc.URL, "/admission/gang"), &http.Client{Timeout: 10 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	}
	t.Fatalf("no webhook of %s points at the extender's /admission/gang", wh.Name)
	return "", nil
}

func getBody(ctx context.Context, hc *http.Client, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// waitStatus polls the running extender's JSON status endpoint path every
// 200 ms, for up to 30 s, until its body decoded as T satisfies ok; it
// returns the last answer (the body, or why there was none) and an error
// when ok never held or a body was not T.
func waitStatus[T any](t *testing.T, c *nodesim.Cluster, path string, ok func(T) bool) (string, error) {
	t.Helper()
	base, hc := extenderEndpoint(t, c)
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		code, body, err := getBody(ctx, hc, base+path)
		if err != nil || code != http.StatusOK {
			last = fmt.Sprintf("%d %s %v", code, body, err)
			return false, nil
		}
		last = string(body)
		var v T
		if err := json.Unmarshal(body, &v); err != nil {
			return false, err
		}
		return ok(v), nil
	})
	return last, err
}

// TestStatusPage opens the running extender's /status in headless
// Chromium with GPU pods running (a whole GPU and a slice in a namespace a
// Queue serves, and a pod that fits no node) and checks that the rendered
// page shows each running pod in the row of the GPU its assignment names,
// the Queue, and the pending pod; it keeps a screenshot
// ($TESSERA_TEST_SCREENSHOT, else the test's temporary directory).
func TestStatusPage(t *testing.T) {
	browser := chromium(t)
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	ns := namespace(t, c, "e2e-status")
	other := namespace(t, c, "e2e-status-big")
	waitReleased(t, c)
	createQueue(t, dyn, "e2e-status-queue", "", []string{ns}, 4, 0)
	waitQueuesSeen(t, c, nil, "e2e-status-queue")
	create(t, client, ns, podSpec{name: "status-whole", gpus: 1})
	create(t, client, ns, podSpec{name: "status-slice", memUnits: 4, cores: 20})
	create(t, client, other, podSpec{name: "status-huge", gpus: 9}) // no node has 9 GPUs
	type want struct{ node, gpu, pod, use string }
	var wants []want
	for _, s := range []struct {
		name  string
		whole int
	}{{"status-whole", 1}, {"status-slice", 0}} {
		name := s.name
		p, _ := waitRunning(t, c, ns, name, 60*time.Second)
		// A slice's assignment comes with its Binding; whole GPUs are
		// recorded by the node agent once the kubelet chose them, which
		// may be after the pod runs (seen in CI: no assignment yet).
		p, ca := waitAssignment(t, c, p, "main", s.whole)
		if ca == nil {
			t.FailNow()
		}
		switch {
		case len(ca.GPUs) == 1:
			wants = append(wants, want{p.Spec.NodeName, fmt.Sprint(ca.GPUs[0].Index), ns + "/" + name, "whole"})
		case ca.Shared != nil:
			wants = append(wants, want{p.Spec.NodeName, fmt.Sprint(ca.Shared.GPU.Index), ns + "/" + name, "shared"})
		default:
			t.Fatalf("%s: unexpected assignment %+v", name, ca)
		}
	}

	// The JSON view first: the ledger holds both pods, and the huge pod
	// waits with no node fitting.
	lastOcc, err := waitStatus(t, c, extender.StatusOccupancyPath, func(occ gpustatus.Cluster) bool {
		seen := 0
		for _, n := range occ.Nodes {
			for _, g := range n.GPUs {
				for _, w := range wants {
					if n.Name == w.node && fmt.Sprint(g.Index) == w.gpu && g.Use() == w.use && (slices.Contains(g.Whole, w.pod) || slices.Contains(g.Shared, w.pod)) {
						seen++
					}
				}
			}
		}
		return seen == len(wants)
	})
	if err != nil {
		t.Fatalf("the extender's /status/occupancy does not show %+v: %v\n%s", wants, err, lastOcc)
	}
	base, hc := extenderEndpoint(t, c)
	code, body, err := getBody(t.Context(), hc, base+extender.StatusPodPath+other+"/status-huge")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/status/pods/%s/status-huge: %d %v %s", other, code, err, body)
	}
	var huge extender.PodStatus
	if err := json.Unmarshal(body, &huge); err != nil || huge.Pending == nil || huge.Pending.Fitting != 0 || len(huge.Pending.Nodes) != len(c.Nodes()) {
		t.Errorf("status-huge: %s (%v): want pending, fitting no node, a reason for each of the %d nodes", body, err, len(c.Nodes()))
	}

	// The page, as a browser renders it.
	dir := t.TempDir()
	start := time.Now()
	dom := runChromium(t, browser, dir, "--dump-dom", base+extender.StatusPath)
	t.Logf("chromium --dump-dom took %s (%d bytes)", time.Since(start).Round(time.Millisecond), len(dom))
	rows := regexp.MustCompile(`(?s)<tr([^>]*)>(.*?)</tr>`).FindAllStringSubmatch(dom, -1)
	rowWith := func(attrs, text string) bool {
		for _, r := range rows {
			if strings.Contains(r[1], attrs) && strings.Contains(r[2], text) {
				return true
			}
		}
		return false
	}
	for _, w := range wants {
		if !rowWith(fmt.Sprintf(`data-node="%s" data-gpu="%s"`, w.node, w.gpu), w.pod) {
			t.Errorf("the page has no row of %s GPU %s holding %s", w.node, w.gpu, w.pod)
		}
		if !rowWith(fmt.Sprintf(`data-node="%s" data-gpu="%s"`, w.node, w.gpu), ">"+w.use+"<") {
			t.Errorf("the row of %s GPU %s does not say %s", w.node, w.gpu, w.use)
		}
	}
	for _, n := range c.Nodes() {
		if !rowWith(fmt.Sprintf(`data-node="%s"`, n.Name), "<td>"+n.Name+"</td>") {
			t.Errorf("the page does not name node %s", n.Name)
		}
	}
	if !rowWith(`data-queue="e2e-status-queue"`, ns) {
		t.Errorf("the page has no row of the Queue e2e-status-queue serving %s", ns)
	}
	if !rowWith(fmt.Sprintf(`data-pod="%s/status-huge"`, other), "9 whole GPU(s)") {
		t.Errorf("the page does not list the pending %s/status-huge", other)
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	shot := filepath.Join(dir, "status-page.png")
	runChromium(t, browser, dir, "--screenshot="+shot, "--window-size=1400,1100", "--hide-scrollbars", base+extender.StatusPath)
	b, err := os.ReadFile(shot)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil || img.Bounds().Dx() < 1000 {
		t.Fatalf("screenshot %s: %v (bounds %v)", shot, err, img)
	}
	if dst := os.Getenv("TESSERA_TEST_SCREENSHOT"); dst != "" {
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s", dst)
	}
}

// runChromium runs headless Chromium on url with args (as root it needs
// --no-sandbox) trusting the extender's test certificate by ignoring
// certificate errors (the page is on loopback), and returns its stdout.
func runChromium(t *testing.T, browser, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--ignore-certificate-errors",
		"--no-first-run", "--user-data-dir=" + filepath.Join(dir, "profile")}, args...)
	cmd := exec.CommandContext(ctx, browser, all...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", browser, strings.Join(all, " "), err, stderr.String())
	}
	return stdout.String()
}
