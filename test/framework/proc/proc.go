// Package proc runs the test framework's processes: each in its own process
// group (stopped as a whole), killed when the test process dies, its output
// appended to a log file.
package proc

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Proc is a started process.
type Proc struct {
	cmd *exec.Cmd
	// Log is the file its output goes to.
	Log  string
	done chan struct{}
}

// Start starts bin with args, its output appended to logPath after a
// header line; env is its environment (nil: this process's).
func Start(name, bin string, args []string, logPath string, env []string) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "==== %s %s at %s\n", bin, strings.Join(args, " "), time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(logf, "==== exited at %s: %v\n", time.Now().Format(time.RFC3339Nano), err)
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill kills the process group and waits for the process.
func (p *Proc) Kill() { p.Stop(0) }

// Stop sends SIGTERM, waits up to grace (none when 0), then kills the
// process group, and waits for the process.
func (p *Proc) Stop(grace time.Duration) {
	if grace > 0 {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Tail is the last n bytes of the file path (or why it cannot be read).
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
