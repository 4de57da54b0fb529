package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"sort"
	"sync"
	"syscall"
	"time"
)

// timingProxy stands between kube-scheduler and a scheduler extender
// (tessera-extender or HAMi's) and times every call, by verb (the last
// element of the path), from the request's arrival to the end of the
// extender's answer: the extender's own time plus one loopback hop. It
// measures both extenders the same way; HAMi exposes no latency metric.
type timingProxy struct {
	target string // http://host:port of the extender
	client *http.Client
	srv    *http.Server
	ln     net.Listener

	mu    sync.Mutex
	calls map[string]*verbStats
}

// verbStats are the durations of one verb's calls.
type verbStats struct {
	d       []time.Duration
	errors  int // transport errors and answers other than 200
	lastErr string
}

func startTimingProxy(target string) (*timingProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("timing proxy: %w", err)
	}
	p := &timingProxy{
		target: target,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxIdleConns: 64}},
		ln:     ln,
		calls:  map[string]*verbStats{},
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// addr is where kube-scheduler should send the extender calls.
func (p *timingProxy) addr() string { return p.ln.Addr().String() }

func (p *timingProxy) close() {
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
}

func (p *timingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	began := time.Now()
	verb := path.Base(r.URL.Path)
	status, err := p.forward(w, r)
	d := time.Since(began)
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.calls[verb]
	if s == nil {
		s = &verbStats{}
		p.calls[verb] = s
	}
	s.d = append(s.d, d)
	if err != nil || status != http.StatusOK {
		s.errors++
		s.lastErr = fmt.Sprintf("status %d", status)
		if err != nil {
			s.lastErr += ": " + err.Error()
		}
	}
}

// forward sends r to the extender and returns its status once its whole
// answer is read (the time measured), then passes the answer on. Errors
// writing to kube-scheduler are not the extender's: kube-scheduler closes
// the connection as soon as it has decoded the JSON, before the trailing
// newline (its extender client uses a json.Decoder).
func (p *timingProxy) forward(w http.ResponseWriter, r *http.Request) (int, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return 0, fmt.Errorf("read request: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return 0, fmt.Errorf("build request: %w", err)
	}
	req.Header = r.Header.Clone()
	resp, err := p.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return 0, fmt.Errorf("forward: %w", err)
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return resp.StatusCode, fmt.Errorf("read answer: %w", err)
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
	return resp.StatusCode, nil
}

// take returns the latency summary of every verb since the last take and
// starts afresh.
func (p *timingProxy) take() map[string]latencySummary {
	p.mu.Lock()
	calls := p.calls
	p.calls = map[string]*verbStats{}
	p.mu.Unlock()
	out := map[string]latencySummary{}
	for verb, s := range calls {
		l := summarize(s.d, s.errors)
		l.lastErr = s.lastErr
		out[verb] = l
	}
	return out
}

// latencySummary is exact (not bucketed) statistics of one verb.
type latencySummary struct {
	calls, errors   int
	mean, p50, p99  time.Duration
	max             time.Duration
	totalOfAllCalls time.Duration
	lastErr         string
}

func summarize(d []time.Duration, errs int) latencySummary {
	s := latencySummary{calls: len(d), errors: errs}
	if len(d) == 0 {
		return s
	}
	sorted := append([]time.Duration(nil), d...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	for _, v := range sorted {
		s.totalOfAllCalls += v
	}
	s.mean = s.totalOfAllCalls / time.Duration(len(sorted))
	s.p50 = nearestRank(sorted, 0.50)
	s.p99 = nearestRank(sorted, 0.99)
	s.max = sorted[len(sorted)-1]
	return s
}

// nearestRank is the q-quantile of sorted by the nearest-rank method.
func nearestRank(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

// startProc runs bin with args (and env added to this process's) as a
// child with its output in logPath, and waits (at most timeout) until GET
// readyURL answers 200 (https with any certificate: kube-scheduler's
// self-signed one). It reuses extenderProc for stop().
func startProc(ctx context.Context, bin string, args, env []string, logPath, readyURL string, timeout time.Duration) (*extenderProc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log %s: %w", logPath, err)
	}
	fmt.Fprintf(logf, "+ %s %v\n", bin, args)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	e := &extenderProc{logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(e.done) }()

	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // readiness of a self-signed loopback server
	}}
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, readyURL, nil)
		if err != nil {
			e.stop()
			return nil, fmt.Errorf("readiness request: %w", err)
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return e, nil
			}
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("%s exited before it was ready; log %s:\n%s", bin, logPath, tail(logPath))
		case <-ctx.Done():
			e.stop()
			return nil, fmt.Errorf("waiting for %s: %w", readyURL, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.stop()
			return nil, fmt.Errorf("%s not ready at %s after %s; log %s:\n%s", bin, readyURL, timeout, logPath, tail(logPath))
		}
	}
}

var errNoBinary = errors.New("peer binary missing")
