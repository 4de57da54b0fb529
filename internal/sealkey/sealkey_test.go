package sealkey

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/api"
)

func TestGetOrCreateMakesOneKey(t *testing.T) {
	cs := fake.NewClientset()
	ctx := context.Background()
	s1, err := GetOrCreate(ctx, In(cs, "kube-system"))
	if err != nil {
		t.Fatal(err)
	}
	sec, err := cs.CoreV1().Secrets("kube-system").Get(ctx, api.SealKeySecretName, metav1.GetOptions{})
	if err != nil || len(sec.Data[api.SealKeyDataKey]) != api.MinSealKeyBytes {
		t.Fatalf("secret %v, %v", sec, err)
	}
	s2, err := GetOrCreate(ctx, In(cs, "kube-system"))
	if err != nil {
		t.Fatal(err)
	}
	if s1.Seal("u", "a", "v") != s2.Seal("u", "a", "v") {
		t.Error("a second start made another key")
	}
	w, err := Wait(ctx, In(cs, "kube-system"), time.Millisecond)
	if err != nil || w.Seal("u", "a", "v") != s1.Seal("u", "a", "v") {
		t.Errorf("Wait: %v", err)
	}
}

func TestGetOrCreateLosesTheRaceGracefully(t *testing.T) {
	winner := bytes.Repeat([]byte{7}, api.MinSealKeyBytes)
	cs := fake.NewClientset()
	// Another extender creates the Secret between our Get and Create.
	cs.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: api.SealKeySecretName}, Data: map[string][]byte{api.SealKeyDataKey: winner}}
		if err := cs.Tracker().Add(s); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewAlreadyExists(corev1.Resource("secrets"), api.SealKeySecretName)
	})
	got, err := GetOrCreate(context.Background(), In(cs, "kube-system"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := api.NewSealer(winner)
	if got.Seal("u", "a", "v") != want.Seal("u", "a", "v") {
		t.Error("the loser does not use the stored key")
	}
}

func TestShortKeyIsAnError(t *testing.T) {
	cs := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: api.SealKeySecretName}, Data: map[string][]byte{api.SealKeyDataKey: []byte("short")}})
	if _, err := GetOrCreate(context.Background(), In(cs, "ns")); err == nil || !strings.Contains(err.Error(), "want at least 32") {
		t.Errorf("GetOrCreate: %v", err)
	}
	if _, err := Wait(context.Background(), In(cs, "ns"), time.Millisecond); err == nil {
		t.Error("Wait accepted a short key")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Wait(ctx, In(fake.NewClientset(), "ns"), 5*time.Millisecond); err == nil {
		t.Error("Wait without the Secret returned")
	}
}
