// Package freeport picks TCP ports for the processes the tests start
// (etcd, kube-apiserver, kube-scheduler, tessera-extender, kubelets), which
// bind the port themselves a moment later.
//
// A port picked by listening on port 0 comes from the kernel's ephemeral
// range, the range every outgoing connection also takes its local port
// from: between the pick and the child's bind, any client in the test
// process or the processes beside it may connect from that very port, and
// the child then fails with "address already in use". Ports are therefore
// drawn at random below the ephemeral range (net.ipv4.ip_local_port_range),
// where the kernel never puts an outgoing connection, and each is checked
// free by listening on it.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the lowest port handed out: below it are the well-known and
// registered services a machine may run.
const lowest = 10000

// rangeFile holds the kernel's ephemeral port range, "low high".
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// Ports returns n distinct TCP ports free on every local address now.
func Ports(n int) ([]int, error) {
	return pick(n, ephemeralLow(rangeFile), listenable)
}

// Port returns one such port.
func Port() (int, error) {
	ps, err := Ports(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

// Addr returns "127.0.0.1:<port>" with such a port.
func Addr() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// ephemeralLow is the low end of the ephemeral range in file, or 0 when it
// cannot be read (not Linux).
func ephemeralLow(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
}

// listenable says whether port can be listened on, on every address.
func listenable(port int) bool {
	l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// pick draws n distinct ports in [lowest, low) that free says are free.
// Without room below the ephemeral range (low unknown, or too close to
// lowest), it falls back to ports the kernel picks, as before.
func pick(n int, low int, free func(int) bool) ([]int, error) {
	if n < 0 {
		return nil, fmt.Errorf("freeport: %d ports asked", n)
	}
	if low-lowest < 1000 {
		return kernelPorts(n)
	}
	out := make([]int, 0, n)
	seen := map[int]bool{}
	for tries := 0; len(out) < n; tries++ {
		if tries == 100*n+100 {
			return nil, fmt.Errorf("freeport: no free port among %d tries in %d..%d", tries, lowest, low-1)
		}
		p := lowest + rand.IntN(low-lowest)
		if seen[p] {
			continue
		}
		seen[p] = true
		if free(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// kernelPorts returns n distinct ports the kernel picks (port 0).
func kernelPorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free loopback port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
