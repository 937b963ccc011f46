package systemd

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notify reports whether a service manager listens (NOTIFY_SOCKET is set).
func Notify() bool { return os.Getenv("NOTIFY_SOCKET") != "" }

// Ready sends READY=1 with an optional STATUS= line.
func Ready(status string) error { return send(daemon.SdNotifyReady, status) }

// Status sends a STATUS= line.
func Status(status string) error { return send("", status) }

// Stopping sends STOPPING=1 with an optional STATUS= line.
func Stopping(status string) error { return send(daemon.SdNotifyStopping, status) }

func send(state, status string) error {
	var lines []string
	if state != "" {
		lines = append(lines, state)
	}
	if status != "" {
		lines = append(lines, "STATUS="+strings.ReplaceAll(status, "\n", " "))
	}
	if len(lines) == 0 {
		return nil
	}
	_, err := daemon.SdNotify(false, strings.Join(lines, "\n"))
	return err
}

// WatchdogInterval is the interval of WATCHDOG_USEC (honouring
// WATCHDOG_PID), 0 when the watchdog is off.
func WatchdogInterval() time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0
	}
	return d
}

// Watchdog sends WATCHDOG=1 every half interval until ctx is done; it
// returns at once when the watchdog is off. Run it in its own goroutine.
func Watchdog(ctx context.Context) {
	d := WatchdogInterval()
	if d <= 0 {
		return
	}
	t := time.NewTicker(max(d/2, time.Millisecond))
	defer t.Stop()
	for {
		_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// StatusLoop sends STATUS=<status()> every interval until ctx is done,
// skipping unchanged lines; it returns at once without a service manager.
func StatusLoop(ctx context.Context, every time.Duration, status func() string) {
	if !Notify() || status == nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s := status(); s != last {
			if Status(s) == nil {
				last = s
			}
		}
	}
}
