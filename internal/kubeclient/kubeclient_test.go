package kubeclient

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFromKubeconfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "certs/c.crt", "c.key"} {
		write(f, "pem")
	}
	key := filepath.Join(dir, "c.key")
	good := write("good", `apiVersion: v1
kind: Config
current-context: c
contexts:
- name: c
  context: {cluster: k, user: u}
clusters:
- name: k
  cluster: {server: "https://10.0.0.1:6443", certificate-authority: ca.crt, tls-server-name: api}
users:
- name: u
  user: {client-certificate: certs/c.crt, client-key: `+key+`}
`)
	cfg, err := FromKubeconfig(good)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://10.0.0.1:6443" || cfg.CAFile != filepath.Join(dir, "ca.crt") || cfg.CertFile != filepath.Join(dir, "certs/c.crt") ||
		cfg.KeyFile != key || cfg.ServerName != "api" {
		t.Errorf("config = %+v", cfg)
	}
	exec := write("exec", `apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://x"}}]
users: [{name: u, user: {exec: {command: aws, args: [eks, get-token], apiVersion: client.authentication.k8s.io/v1, interactiveMode: Never}}}]
`)
	cfg, err = FromKubeconfig(exec)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ExecProvider == nil || cfg.ExecProvider.Command != "aws" {
		t.Errorf("exec plugin not kept: %+v", cfg.ExecProvider)
	}
	for name, content := range map[string]string{
		"missing context": "apiVersion: v1\nkind: Config\ncurrent-context: z\n",
		"garbage":         "{{{",
		"missing CA":      "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: {server: https://x, certificate-authority: nope.crt}}]\n",
	} {
		if _, err := FromKubeconfig(write(name, content)); err == nil || !strings.Contains(err.Error(), "kubeconfig "+filepath.Join(dir, name)) {
			t.Errorf("%s: FromKubeconfig = %v, want an error naming the file", name, err)
		}
	}
	if _, err := FromKubeconfig(filepath.Join(dir, "absent")); err == nil {
		t.Error("a missing kubeconfig file was accepted")
	}
}

func TestConfigOutsideAPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := Config(""); !errors.Is(err, ErrNotInCluster) {
		t.Errorf("Config(\"\") outside a pod = %v, want ErrNotInCluster", err)
	}
}
