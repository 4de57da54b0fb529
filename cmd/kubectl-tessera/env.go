package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/podtrust"
)

// env is what every subcommand reads through.
type env struct {
	client kubernetes.Interface
	dyn    dynamic.Interface
	// ext reaches the extender's /status endpoints; nil: not asked.
	ext extenderClient
	// server is the API server's address, for error messages.
	server           string
	sealKeyNamespace string
	now              func() time.Time
	// stderr receives notes (what could not be read, where from).
	stderr io.Writer
}

// apiErr wraps an API server error with what was read and what to check.
func (e *env) apiErr(what string, err error) error {
	switch {
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		return fmt.Errorf("reading %s from the API server %s: %w (check that your kubeconfig's user may read it: kubectl auth can-i list %s)", what, e.server, err, what)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("reading %s from the API server %s: %w (no answer in time: is the cluster up? see --request-timeout)", what, e.server, err)
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return fmt.Errorf("reading %s from the API server %s: %w", what, e.server, err)
	}
	return fmt.Errorf("reading %s: the API server %s is unreachable: %w (check --kubeconfig, --context and that the cluster is up)", what, e.server, err)
}

// trust returns the filter that keeps only Tessera's sealed decisions on
// pods. Without the seal key it returns an error saying why: the caller
// then shows no assignment as Tessera's.
func (e *env) trust(ctx context.Context) (*podtrust.Filter, error) {
	s, err := e.client.CoreV1().Secrets(e.sealKeyNamespace).Get(ctx, api.SealKeySecretName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the seal key (Secret %s/%s): %w", e.sealKeyNamespace, api.SealKeySecretName, err)
	}
	sealer, err := api.NewSealer(s.Data[api.SealKeyDataKey])
	if err != nil {
		return nil, fmt.Errorf("the seal key (Secret %s/%s): %w", e.sealKeyNamespace, api.SealKeySecretName, err)
	}
	return &podtrust.Filter{Sealer: sealer, Component: "kubectl-tessera"}, nil
}

// extenderClient GETs a JSON status view of tessera-extender.
type extenderClient interface {
	// Get decodes the answer at path (e.g. /status/occupancy) into v.
	Get(ctx context.Context, path string, v any) error
	// Where names the extender for messages.
	Where() string
}

func newExtenderClient(o *options, client kubernetes.Interface) (extenderClient, error) {
	switch o.extender {
	case "none":
		return nil, nil
	case "":
		spec := o.extenderService
		scheme := ""
		if s, rest, ok := strings.Cut(spec, ":"); ok && (s == "https" || s == "http") {
			scheme, spec = s, rest
		}
		nsName, port, ok := strings.Cut(spec, ":")
		ns, name, ok2 := strings.Cut(nsName, "/")
		if !ok || !ok2 || ns == "" || name == "" || port == "" {
			return nil, fmt.Errorf("--extender-service %q: want namespace/name:port", o.extenderService)
		}
		return &proxyExtender{client: client, scheme: scheme, namespace: ns, name: name, port: port}, nil
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.extenderInsecure} //nolint:gosec // the user asked
	if o.extenderCA != "" {
		pem, err := os.ReadFile(o.extenderCA)
		if err != nil {
			return nil, fmt.Errorf("--extender-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--extender-ca %s: no PEM certificate in it", o.extenderCA)
		}
		tlsCfg.RootCAs = pool
	}
	return &urlExtender{base: strings.TrimSuffix(o.extender, "/"), client: &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}}, nil
}

// urlExtender reaches the extender at a URL.
type urlExtender struct {
	base   string
	client *http.Client
}

func (u *urlExtender) Where() string { return u.base }

func (u *urlExtender) Get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.base+path, nil)
	if err != nil {
		return fmt.Errorf("tessera-extender %s: %w", u.base, err)
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return fmt.Errorf("tessera-extender at %s is unreachable: %w (check --extender and, for HTTPS, --extender-ca)", u.base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("tessera-extender %s%s: %w", u.base, path, err)
	}
	return decodeStatus(u.base+path, resp.StatusCode, body, v)
}

// proxyExtender reaches the extender's Service through the API server's
// service proxy (needs get on services/proxy).
type proxyExtender struct {
	client                        kubernetes.Interface
	scheme, namespace, name, port string
}

func (p *proxyExtender) Where() string {
	return fmt.Sprintf("Service %s/%s port %s (through the API server's proxy)", p.namespace, p.name, p.port)
}

func (p *proxyExtender) Get(ctx context.Context, path string, v any) error {
	body, err := p.client.CoreV1().Services(p.namespace).ProxyGet(p.scheme, p.name, p.port, path, nil).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("tessera-extender through %s: %w (is the extender deployed there? may you get services/proxy? or pass --extender URL)", p.Where(), err)
	}
	return decodeStatus(p.Where()+" "+path, http.StatusOK, body, v)
}

func decodeStatus(where string, code int, body []byte, v any) error {
	if code != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return fmt.Errorf("tessera-extender %s: %d %s: %s", where, code, http.StatusText(code), e.Error)
		}
		return fmt.Errorf("tessera-extender %s: %d %s", where, code, http.StatusText(code))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("tessera-extender %s: not a status answer: %w", where, err)
	}
	return nil
}
