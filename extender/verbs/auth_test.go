package verbs_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/verbs"
)

// TestRequireClientCert serves the wrapped verbs over TLS that asks for
// (but does not require) client certificates, as tessera-extender does
// with --verbs-client-ca: only a caller with a certificate of the CA gets
// through.
func TestRequireClientCert(t *testing.T) {
	ca, other := testbuild.NewCA(t, "verbs-ca"), testbuild.NewCA(t, "other-ca")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	var reached atomic.Int32
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		verbs.WriteJSON(r.Context(), w, http.StatusOK, map[string]string{"Error": ""})
	})
	srv := httptest.NewUnstartedServer(verbs.RequireClientCert(next))
	srv.TLS = &tls.Config{ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	serverCAs := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs

	tests := []struct {
		name string
		// certs the client offers (nil: none).
		certs []tls.Certificate
		// status is the answer; 0: the TLS handshake fails.
		status int
	}{
		{"no client certificate", nil, http.StatusForbidden},
		{"certificate of the CA", []tls.Certificate{ca.Client(t)}, http.StatusOK},
		{"certificate of another CA", []tls.Certificate{other.Client(t)}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reached.Store(0)
			// Offer the certificate whatever CAs the server names (Go's
			// client would send none of another CA; curl sends it).
			offer := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				if len(tc.certs) == 0 {
					return &tls.Certificate{}, nil
				}
				return &tc.certs[0], nil
			}
			hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
				RootCAs: serverCAs, GetClientCertificate: offer, MinVersion: tls.VersionTLS12}}}
			resp, err := hc.Post(srv.URL+verbs.PathBind, "application/json", strings.NewReader(`{"podName":"victim","podNamespace":"users","node":"m1"}`))
			if tc.status == 0 {
				if err == nil {
					resp.Body.Close()
					t.Fatalf("status %d, want the handshake refused", resp.StatusCode)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var reply map[string]string
				if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil {
					t.Fatalf("reply is not JSON: %v", err)
				}
				if resp.StatusCode != tc.status {
					t.Errorf("status %d, want %d (reply %v)", resp.StatusCode, tc.status, reply)
				}
				if tc.status == http.StatusForbidden && reply["error"] != verbs.ErrNoClientCert {
					t.Errorf("reply %v, want error %q", reply, verbs.ErrNoClientCert)
				}
			}
			want := int32(0)
			if tc.status == http.StatusOK {
				want = 1
			}
			if got := reached.Load(); got != want {
				t.Errorf("the verb was called %d times, want %d", got, want)
			}
		})
	}
}

// TestRequireClientCertWithoutVerifiedChain: a request over plain HTTP,
// or over TLS with a certificate the server did not verify (a server
// that asks for any certificate), is refused.
func TestRequireClientCertWithoutVerifiedChain(t *testing.T) {
	ca := testbuild.NewCA(t, "verbs-ca")
	var reached atomic.Int32
	h := verbs.RequireClientCert(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached.Add(1) }))
	tests := []struct {
		name string
		tls  *tls.ConnectionState
	}{
		{"plain HTTP", nil},
		{"TLS without a certificate", &tls.ConnectionState{HandshakeComplete: true}},
		{"certificate not verified", &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{ca.Cert}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{verbs.PathFilter, verbs.PathPrioritize, verbs.PathPrioritizeCPU, verbs.PathBind, verbs.PathPreempt} {
				req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
				req.TLS = tc.tls
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "client certificate") {
					t.Errorf("%s: %d %s, want 403 naming the client certificate", path, rec.Code, rec.Body)
				}
			}
		})
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the verbs were called %d times", n)
	}
}
