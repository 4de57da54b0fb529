package install

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLS is a serving certificate for tessera-extender, kube-scheduler's
// client certificate for the extender's verbs, and the CA that signed
// both: what the API server (gang webhook) and kube-scheduler (extender
// calls) are given to trust the extender, and what the extender is given
// to trust kube-scheduler (--verbs-client-ca).
type TLS struct {
	// CAPEM is the CA certificate (PEM), for caBundle and tlsConfig.caData.
	CAPEM []byte
	// CertFile and KeyFile are the serving certificate and its key (PEM),
	// for --tls-cert and --tls-key.
	CertFile, KeyFile string
	// CAFile holds CAPEM, for clients given a file (kubectl tessera
	// --extender-ca) and for the extender's --verbs-client-ca.
	CAFile string
	// ClientCertFile and ClientKeyFile are kube-scheduler's client
	// certificate and its key (PEM), for the extender entries' tlsConfig
	// certFile and keyFile.
	ClientCertFile, ClientKeyFile string
}

// ServingCert makes a fresh CA, a serving certificate it signs for
// 127.0.0.1, localhost and the extender Service's names, and a client
// certificate for kube-scheduler (each valid for a day), and writes the
// certificates and their keys to dir.
func ServingCert(dir string) (*TLS, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tessera-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "tessera-extender"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost", "tessera-extender.kube-system.svc", "tessera-extender.kube-system.svc.cluster.local"},
	}
	out := &TLS{
		CAPEM:          pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		CertFile:       filepath.Join(dir, "extender-tls.crt"),
		KeyFile:        filepath.Join(dir, "extender-tls.key"),
		CAFile:         filepath.Join(dir, "extender-ca.crt"),
		ClientCertFile: filepath.Join(dir, "scheduler-client.crt"),
		ClientKeyFile:  filepath.Join(dir, "scheduler-client.key"),
	}
	if err := os.WriteFile(out.CAFile, out.CAPEM, 0o644); err != nil {
		return nil, fmt.Errorf("write CA certificate: %w", err)
	}
	if err := signed(tmpl, ca, caKey, out.CertFile, out.KeyFile); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	client := &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "kube-scheduler"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := signed(client, ca, caKey, out.ClientCertFile, out.ClientKeyFile); err != nil {
		return nil, fmt.Errorf("kube-scheduler's client certificate: %w", err)
	}
	return out, nil
}

// signed makes a key and the certificate of tmpl ca signs for it, and
// writes them (PEM) to certFile and keyFile.
func signed(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("create certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal key: %w", err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write certificate: %w", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return fmt.Errorf("write key: %w", err)
	}
	return nil
}

// CertPool is a pool holding only the CA, for clients of the extender.
func (t *TLS) CertPool() (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(t.CAPEM) {
		return nil, fmt.Errorf("no certificate in the CA PEM")
	}
	return pool, nil
}
