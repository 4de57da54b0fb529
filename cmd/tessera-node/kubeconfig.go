package main

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/yaml"
)

// loadKubeconfig builds a client configuration from a kubeconfig file's
// current context: the server, its CA, and client certificates, a bearer
// token (or token file) or basic auth. Relative paths are relative to the
// file. Exec and auth-provider plugins are not supported (the agent runs
// in-cluster or with a service-account-style kubeconfig); they are an
// error, never ignored.
//
// client-go's clientcmd would do this, but it is not in the module's
// dependency set; its file format types are.
func loadKubeconfig(path string) (*rest.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading kubeconfig: %w", err)
	}
	var kc clientcmdv1.Config
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	if kc.CurrentContext == "" {
		return nil, fmt.Errorf("kubeconfig %s: no current-context", path)
	}
	var ctx *clientcmdv1.Context
	for i := range kc.Contexts {
		if kc.Contexts[i].Name == kc.CurrentContext {
			ctx = &kc.Contexts[i].Context
		}
	}
	if ctx == nil {
		return nil, fmt.Errorf("kubeconfig %s: current-context %q is not among its contexts", path, kc.CurrentContext)
	}
	var cluster *clientcmdv1.Cluster
	for i := range kc.Clusters {
		if kc.Clusters[i].Name == ctx.Cluster {
			cluster = &kc.Clusters[i].Cluster
		}
	}
	if cluster == nil || cluster.Server == "" {
		return nil, fmt.Errorf("kubeconfig %s: context %q names cluster %q, which has no server", path, kc.CurrentContext, ctx.Cluster)
	}
	var user clientcmdv1.AuthInfo
	found := ctx.AuthInfo == ""
	for i := range kc.AuthInfos {
		if kc.AuthInfos[i].Name == ctx.AuthInfo {
			user, found = kc.AuthInfos[i].AuthInfo, true
		}
	}
	if !found {
		return nil, fmt.Errorf("kubeconfig %s: context %q names user %q, which is not among its users", path, kc.CurrentContext, ctx.AuthInfo)
	}
	if user.Exec != nil || user.AuthProvider != nil {
		return nil, fmt.Errorf("kubeconfig %s: user %q authenticates through an exec or auth-provider plugin, which tessera-node does not support", path, ctx.AuthInfo)
	}
	dir := filepath.Dir(path)
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	return &rest.Config{
		Host:            cluster.Server,
		BearerToken:     user.Token,
		BearerTokenFile: abs(user.TokenFile),
		Username:        user.Username,
		Password:        user.Password,
		TLSClientConfig: rest.TLSClientConfig{
			Insecure:   cluster.InsecureSkipTLSVerify,
			ServerName: cluster.TLSServerName,
			CAFile:     abs(cluster.CertificateAuthority),
			CAData:     cluster.CertificateAuthorityData,
			CertFile:   abs(user.ClientCertificate),
			CertData:   user.ClientCertificateData,
			KeyFile:    abs(user.ClientKey),
			KeyData:    user.ClientKeyData,
		},
	}, nil
}
