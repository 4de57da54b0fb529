package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// process is one child process whose stdout and stderr go to a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{} // closed once the process has exited
	waitErr error         // valid after done is closed

	stopOnce sync.Once
	stopErr  error
}

// startProcess starts bin with args. Output goes to <logDir>/<name>.log. The
// child gets its own process group (so Stop can kill what it forks) and
// SIGKILL when the thread that started it dies, as a last resort when the
// test binary crashes.
func startProcess(name, bin string, args []string, logDir string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log file for %s: %w", name, err)
	}
	fmt.Fprintf(logFile, "+ %s %s\n", bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: logFile, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	klog.V(2).InfoS("Started process", "name", name, "pid", cmd.Process.Pid, "log", logPath)
	return p, nil
}

// exited reports whether the process has already exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, waits up to grace and then sends
// SIGKILL. Signals go out only while the group leader has not been reaped
// (so its pid cannot have been reused). It is safe to call more than once.
func (p *process) stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	p.stopOnce.Do(func() { p.stopErr = p.doStop(grace) })
	return p.stopErr
}

func (p *process) doStop(grace time.Duration) error {
	defer p.logFile.Close()
	pgid := p.cmd.Process.Pid
	if p.exited() {
		return nil
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	klog.InfoS("Process did not stop in time, killing it", "name", p.name, "pid", pgid, "grace", grace)
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, pgid)
	}
}

// logTail returns at most maxBytes from the end of the process log.
func (p *process) logTail(maxBytes int64) string {
	return fileTail(p.logPath, maxBytes)
}

func fileTail(path string, maxBytes int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("<cannot read %s: %v>", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("<cannot stat %s: %v>", path, err)
	}
	off := st.Size() - maxBytes
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Sprintf("<cannot read %s: %v>", path, err)
	}
	if off > 0 {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
		return fmt.Sprintf("[... first %d bytes of %s skipped]\n%s", off, path, buf)
	}
	return string(buf)
}

// waitFor polls check every interval until it returns nil, ctx ends, timeout
// passes or the process exits. The returned error names what was waited for
// and carries the last error from check and the tail of the process log.
func (p *process) waitFor(ctx context.Context, what string, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	const interval = 100 * time.Millisecond
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) while waiting for %s (last check: %w); log tail:\n%s",
				p.name, p.waitErr, what, last, p.logTail(8<<10))
		case <-ctx.Done():
			return fmt.Errorf("timed out after %s waiting for %s (last check: %w); log tail:\n%s",
				timeout, what, last, p.logTail(8<<10))
		case <-time.After(interval):
		}
	}
}
