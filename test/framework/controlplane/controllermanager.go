package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ControllerManagerOptions configure kube-controller-manager.
type ControllerManagerOptions struct {
	// Controllers is its --controllers list; empty: LocalControllers().
	Controllers []string
	// Args are appended to the flags the harness passes.
	Args []string
}

// LocalControllers are the controllers the local clusters run: those a
// user's manifests need (Deployments, ReplicaSets, ReplicationControllers,
// Jobs, CronJobs, StatefulSets, DaemonSets, finished Jobs' TTL), every
// namespace's default ServiceAccount and kube-root-ca.crt, garbage
// collection of owned objects, namespace deletion, the status of
// PodDisruptionBudgets and ResourceQuotas, Services' endpoints, and the
// aggregated ClusterRoles (admin, edit, view). Not the node controllers
// (node lifecycle, taint eviction, the garbage collection of pods on lost
// nodes, IPAM, routes): the node simulators own their Nodes and their
// pods' phases. Not volumes, certificates or cloud providers either.
func LocalControllers() []string {
	return []string{
		"serviceaccount-controller", "root-ca-certificate-publisher-controller",
		"deployment-controller", "replicaset-controller", "replicationcontroller-controller",
		"job-controller", "cronjob-controller", "ttl-after-finished-controller",
		"statefulset-controller", "daemonset-controller",
		"garbage-collector-controller", "namespace-controller",
		"disruption-controller", "resourcequota-controller",
		"endpoints-controller", "endpointslice-controller",
		"clusterrole-aggregation-controller",
	}
}

// StartControllerManager runs kube-controller-manager (as
// ControllerManagerUser, each controller with its own ServiceAccount's
// credentials) with o, and waits until its ServiceAccount controller has
// made kube-system's default ServiceAccount. It fails when one started by
// this control plane is still running.
func (cp *ControlPlane) StartControllerManager(ctx context.Context, o ControllerManagerOptions) error {
	if err := checkBinary("kube-controller-manager", cp.opts.Binaries.ControllerManager); err != nil {
		return err
	}
	cp.mu.Lock()
	if cp.controllerManager != nil && !cp.controllerManager.exited() {
		cp.mu.Unlock()
		return errors.New("kube-controller-manager is already running")
	}
	cp.mu.Unlock()
	dir := filepath.Join(cp.dir, "controller-manager")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create controller manager dir: %w", err)
	}
	kubeconfig := filepath.Join(dir, "controller-manager.kubeconfig")
	if err := writeKubeconfig(kubeconfig, cp.APIServerURL, cp.caFile, ControllerManagerUser, cp.kcmUser.Token); err != nil {
		return err
	}
	controllers := o.Controllers
	if len(controllers) == 0 {
		controllers = LocalControllers()
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--use-service-account-credentials=true",
		"--root-ca-file=" + cp.caFile,
		"--leader-elect=false",
		"--secure-port=0", // nothing scrapes it; readiness is checked below
		"--v=1",
	}
	args = append(args, o.Args...)
	p, err := startProcess("kube-controller-manager", cp.opts.Binaries.ControllerManager, args, cp.dir)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.controllerManager = p
	cp.mu.Unlock()
	return p.waitFor(ctx, "kube-controller-manager (kube-system/default ServiceAccount)", cp.timeout, func(ctx context.Context) error {
		_, err := cp.client.CoreV1().ServiceAccounts("kube-system").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("not made yet: %w", err)
		}
		return err
	})
}

// StopControllerManager stops the running kube-controller-manager, if any.
func (cp *ControlPlane) StopControllerManager() error {
	cp.mu.Lock()
	p := cp.controllerManager
	cp.controllerManager = nil
	cp.mu.Unlock()
	return p.stop(stopGracePeriod)
}
