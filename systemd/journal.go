package systemd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
)

// JournalHandler returns a slog handler that writes to the systemd journal
// when the process runs as a systemd unit (INVOCATION_ID is set) and the
// journal socket answers; otherwise it returns nil and the caller keeps its
// own handler. level is the minimum level (nil: info).
func JournalHandler(level slog.Leveler) slog.Handler {
	if os.Getenv("INVOCATION_ID") == "" || !journal.Enabled() {
		return nil
	}
	return newJournalHandler(level, journal.Send)
}

type sendFunc func(msg string, pri journal.Priority, vars map[string]string) error

type journalHandler struct {
	level  slog.Leveler
	send   sendFunc
	ident  string
	attrs  []slog.Attr // pre-resolved, keys already qualified by groups
	groups []string
	mu     *sync.Mutex
}

func newJournalHandler(level slog.Leveler, send sendFunc) *journalHandler {
	if level == nil {
		level = slog.LevelInfo
	}
	return &journalHandler{level: level, send: send, ident: filepath.Base(os.Args[0]), mu: &sync.Mutex{}}
}

func (h *journalHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range as {
		c.attrs = appendAttr(c.attrs, h.groups, a)
	}
	return &c
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.groups = append(append([]string(nil), h.groups...), name)
	return &c
}

func (h *journalHandler) Handle(_ context.Context, r slog.Record) error {
	attrs := append([]slog.Attr(nil), h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		attrs = appendAttr(attrs, h.groups, a)
		return true
	})
	var msg strings.Builder
	msg.WriteString(r.Message)
	vars := map[string]string{}
	if h.ident != "" {
		vars["SYSLOG_IDENTIFIER"] = h.ident
	}
	for _, a := range attrs {
		v := a.Value.String()
		fmt.Fprintf(&msg, " %s=%s", a.Key, quoteValue(v))
		if f := fieldName(a.Key); f != "" {
			vars[f] = v
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.send(msg.String(), priority(r.Level), vars)
}

// appendAttr flattens groups into dotted keys and resolves values.
func appendAttr(dst []slog.Attr, groups []string, a slog.Attr) []slog.Attr {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return dst
	}
	if a.Value.Kind() == slog.KindGroup {
		g := groups
		if a.Key != "" {
			g = append(append([]string(nil), groups...), a.Key)
		}
		for _, sub := range a.Value.Group() {
			dst = appendAttr(dst, g, sub)
		}
		return dst
	}
	if len(groups) > 0 {
		a.Key = strings.Join(groups, ".") + "." + a.Key
	}
	if a.Value.Kind() == slog.KindTime {
		a.Value = slog.StringValue(a.Value.Time().Format(time.RFC3339Nano))
	}
	return append(dst, a)
}

// fieldName maps a slog key to a journal field name: upper case, [A-Z0-9_],
// not starting with '_' or a digit (those are trusted or invalid fields),
// and not one of the fields the handler sets itself.
func fieldName(key string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(key) {
		switch {
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	f := strings.TrimLeft(b.String(), "_0123456789")
	if len(f) > 64 {
		f = f[:64]
	}
	switch f {
	case "", "MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER":
		return ""
	}
	return f
}

func quoteValue(v string) string {
	if v == "" || strings.ContainsAny(v, " \t\n\"=") {
		return fmt.Sprintf("%q", v)
	}
	return v
}

func priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	default:
		return journal.PriDebug
	}
}
