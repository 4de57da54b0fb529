package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/allocator"
)

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"tls cert without key", []string{"--tls-cert=x"}, "go together"},
		{"unknown policy", []string{"--policy=nope", "--kubeconfig=/nonexistent"}, allocator.ErrUnknownPolicy.Error()},
		{"missing kubeconfig", []string{"--kubeconfig=/nonexistent/kubeconfig"}, "kubeconfig"},
		{"stray argument", []string{"extra"}, "unexpected arguments"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%v) = %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
	if err := run(context.Background(), []string{"--help"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v, want flag.ErrHelp", err)
	}
}
