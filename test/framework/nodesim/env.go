package nodesim

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresource "k8s.io/kubernetes/pkg/api/v1/resource"
	"k8s.io/kubernetes/pkg/fieldpath"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// containerEnv is the environment the kubelet gives container c of pod
// before the runtime and the device plugins add theirs: envFrom's
// ConfigMaps and Secrets in order (with their prefixes), then env, whose
// values expand $(VAR) references to what came before and whose
// valueFrom reads the pod's fields (fieldRef), the container's resources
// (resourceFieldRef), and keys of ConfigMaps and Secrets. A ConfigMap,
// Secret or key that is missing and not optional is an error, as the
// kubelet's CreateContainerConfigError; the node simulator fails the pod
// with it. The pod's IPs and the service-link variables are not
// simulated.
func containerEnv(ctx context.Context, client kubernetes.Interface, pod *v1.Pod, c *v1.Container) (map[string]string, error) {
	src := &envSources{ctx: ctx, client: client, ns: pod.Namespace,
		configMaps: map[string]*v1.ConfigMap{}, secrets: map[string]*v1.Secret{}}
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := src.configMap(from.ConfigMapRef.Name, from.ConfigMapRef.Optional)
			if err != nil {
				return nil, err
			}
			if cm != nil {
				for k, v := range cm.Data {
					env[from.Prefix+k] = v
				}
			}
		case from.SecretRef != nil:
			s, err := src.secret(from.SecretRef.Name, from.SecretRef.Optional)
			if err != nil {
				return nil, err
			}
			if s != nil {
				for k, v := range s.Data {
					env[from.Prefix+k] = string(v)
				}
			}
		}
	}
	mapping := expansion.MappingFuncFor(env)
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = expansion.Expand(e.Value, mapping)
			continue
		}
		v, set, err := src.valueFrom(pod, c, e.ValueFrom)
		if err != nil {
			return nil, fmt.Errorf("environment variable %s of container %s: %w", e.Name, c.Name, err)
		}
		if set {
			env[e.Name] = v
		}
	}
	return env, nil
}

// configError is a container's configuration that cannot be read (its
// environment's sources): the kubelet's CreateContainerConfigError.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// envSources reads the ConfigMaps and Secrets of one container's
// environment, each once.
type envSources struct {
	ctx        context.Context
	client     kubernetes.Interface
	ns         string
	configMaps map[string]*v1.ConfigMap
	secrets    map[string]*v1.Secret
}

func optionalRef(o *bool) bool { return o != nil && *o }

// configMap is ConfigMap name, nil when it is missing and optional.
func (s *envSources) configMap(name string, optional *bool) (*v1.ConfigMap, error) {
	if cm, ok := s.configMaps[name]; ok {
		return cm, nil
	}
	cm, err := s.client.CoreV1().ConfigMaps(s.ns).Get(s.ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && optionalRef(optional):
		cm = nil
	case err != nil:
		return nil, fmt.Errorf("configmap %q: %w", name, err)
	}
	s.configMaps[name] = cm
	return cm, nil
}

// secret is Secret name, nil when it is missing and optional.
func (s *envSources) secret(name string, optional *bool) (*v1.Secret, error) {
	if sec, ok := s.secrets[name]; ok {
		return sec, nil
	}
	sec, err := s.client.CoreV1().Secrets(s.ns).Get(s.ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && optionalRef(optional):
		sec = nil
	case err != nil:
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}
	s.secrets[name] = sec
	return sec, nil
}

// valueFrom is one variable's value from its source; set is false when an
// optional source or key is missing (the variable is left out).
func (s *envSources) valueFrom(pod *v1.Pod, c *v1.Container, from *v1.EnvVarSource) (string, bool, error) {
	switch {
	case from.FieldRef != nil:
		switch from.FieldRef.FieldPath {
		case "spec.nodeName":
			return pod.Spec.NodeName, true, nil
		case "spec.serviceAccountName":
			return pod.Spec.ServiceAccountName, true, nil
		}
		v, err := fieldpath.ExtractFieldPathAsString(pod, from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		v, err := podresource.ExtractContainerResourceValue(from.ResourceFieldRef, c)
		return v, err == nil, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := s.configMap(ref.Name, ref.Optional)
		if err != nil || cm == nil {
			return "", false, err
		}
		v, ok := cm.Data[ref.Key]
		if !ok && !optionalRef(ref.Optional) {
			return "", false, fmt.Errorf("configmap %q has no key %q", ref.Name, ref.Key)
		}
		return v, ok, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		sec, err := s.secret(ref.Name, ref.Optional)
		if err != nil || sec == nil {
			return "", false, err
		}
		v, ok := sec.Data[ref.Key]
		if !ok && !optionalRef(ref.Optional) {
			return "", false, fmt.Errorf("secret %q has no key %q", ref.Name, ref.Key)
		}
		return string(v), ok, nil
	}
	return "", false, nil
}
