// Package sealkey loads the key that seals Tessera's decision annotations
// (api.Sealer) from its Secret: the extender creates it when it is missing,
// node agents wait for it.
package sealkey

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
)

// Secrets is the part of the API the key needs.
type Secrets interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error)
	Create(ctx context.Context, secret *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error)
}

// In returns the Secrets of namespace.
func In(client kubernetes.Interface, namespace string) Secrets {
	return client.CoreV1().Secrets(namespace)
}

// fromSecret reads and checks the key of s.
func fromSecret(s *corev1.Secret) (*api.Sealer, error) {
	sealer, err := api.NewSealer(s.Data[api.SealKeyDataKey])
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s, data %q: %w", s.Namespace, s.Name, api.SealKeyDataKey, err)
	}
	return sealer, nil
}

// GetOrCreate returns the Sealer of the key in the Secret
// api.SealKeySecretName, creating the Secret with a new random key when it
// does not exist (two creators racing agree on the one that was stored).
func GetOrCreate(ctx context.Context, secrets Secrets) (*api.Sealer, error) {
	s, err := secrets.Get(ctx, api.SealKeySecretName, metav1.GetOptions{})
	if err == nil {
		return fromSecret(s)
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("seal key: %w", err)
	}
	key := make([]byte, api.MinSealKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("seal key: %w", err)
	}
	s = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: api.SealKeySecretName, Labels: map[string]string{"app.kubernetes.io/part-of": "tessera"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{api.SealKeyDataKey: key},
	}
	created, err := secrets.Create(ctx, s, metav1.CreateOptions{})
	switch {
	case err == nil:
		klog.FromContext(ctx).Info("Created the seal key", "secret", api.SealKeySecretName)
		return fromSecret(created)
	case apierrors.IsAlreadyExists(err):
		if s, err = secrets.Get(ctx, api.SealKeySecretName, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("seal key: %w", err)
		}
		return fromSecret(s)
	}
	return nil, fmt.Errorf("seal key: creating secret %s: %w", api.SealKeySecretName, err)
}

// Wait returns the Sealer of the key in the Secret api.SealKeySecretName,
// polling every interval until it exists (the extender creates it) or ctx
// ends. A Secret whose key is too short is an error at once.
func Wait(ctx context.Context, secrets Secrets, interval time.Duration) (*api.Sealer, error) {
	logger := klog.FromContext(ctx)
	var sealer *api.Sealer
	err := wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		s, err := secrets.Get(ctx, api.SealKeySecretName, metav1.GetOptions{})
		if err != nil {
			logger.Info("Waiting for the seal key", "secret", api.SealKeySecretName, "err", err)
			return false, nil
		}
		sealer, err = fromSecret(s)
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("seal key: %w", err)
	}
	return sealer, nil
}
