package mcpserver

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/cli"
)

// yielding runs exec_command or write_command_stdin as a series of short
// yields that add up to the caller's yield_time_ms, so that
//   - a cancelled exec_command interrupts its command: the first request is
//     short and runs to its end even when the call is cancelled (only its
//     answer carries the command's ID), then the command is cancelled as
//     write_command_stdin "\u0003" does (SIGINT, SIGKILL after 500 ms,
//     status cancelled, exit code 130), and its session finalizes as after
//     any command end: an implicit session publishes what the command had
//     written before the cancel; an explicit session keeps it unpublished;
//   - a cancelled poll closes its connection, which cancels the supervisor
//     request, and leaves the command running;
//   - with a progressToken, every yield but the last (whose output is the
//     response) sends notifications/progress with its new output, the
//     first one at 1 s, so a client's request timeout can be reset.
//
// The rows of all yields are joined in order, so the result is the one a
// single yield of the same length would have returned.
func (p *projection) yielding(ctx context.Context, r *catalog.Request, token mcp.ProgressToken) map[string]any {
	start := time.Now()
	budget := time.Duration(catalog.Args(r.Args).Uint("yield_time_ms")) * time.Millisecond
	isExec := r.Op == "exec_command"
	first := *r
	first.Args = maps.Clone(r.Args)
	first.Args["yield_time_ms"] = uint64(min(budget, firstSlice).Milliseconds())
	callCtx := ctx
	if isExec {
		// Its answer names the command to cancel; cancelling the request
		// itself would lose that.
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
	}
	resp := p.call(callCtx, &first)
	if catalog.ErrorFromResponse(resp) != nil {
		return resp
	}
	id, _ := resp["command_session_id"].(string)
	acc := &merged{first: resp}
	seq := 0
	// notify sends a slice's news: every slice that ends with the command
	// still running and time left in the yield, the first one (1 s)
	// included. The last slice's news travels in the response itself; a
	// notification written after it would confuse clients.
	notify := func(out map[string]any) {
		seq++
		if token == nil || ctx.Err() != nil || !running(out) || time.Since(start) >= budget {
			return
		}
		msg, _ := out["output"].(string)
		msg = cli.StripANSI(msg)
		if n := len(msg); n > 2000 {
			msg = "…" + msg[n-2000:]
		}
		_ = p.srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
			"progressToken": token, "progress": seq, "message": msg,
		})
	}
	notify(resp)
	for running(acc.last()) {
		if ctx.Err() != nil {
			if isExec {
				p.interrupt(ctx, r, id)
			}
			return acc.result(start)
		}
		left := budget - time.Since(start)
		if left <= 0 {
			break
		}
		poll := &catalog.Request{Op: "write_command_stdin", RequestID: cli.NewRequestID(), Scope: r.Scope,
			Args: catalog.Args{"command_session_id": id, "stdin": "", "yield_time_ms": ceilMs(min(left, pollSlice))}}
		next := p.call(ctx, poll)
		if e := catalog.ErrorFromResponse(next); e != nil {
			if ctx.Err() != nil {
				continue // cancelled: handled at the top of the loop
			}
			if e.Kind != catalog.OperationFailed {
				return next
			}
			// "command already completed": the command is finalizing or
			// done; read the rest by offset, which does not need the cursor.
			next = p.readRest(ctx, r.Scope, id, acc, start.Add(budget))
			if next == nil {
				break
			}
		}
		acc.add(next)
		notify(next)
	}
	return acc.result(start)
}

// readRest reads rows after what acc holds until the command is terminal
// or the deadline passes; it returns the rows read as one command output
// (nil on an error or at the deadline without news).
func (p *projection) readRest(ctx context.Context, scope catalog.RequestScope, id string, acc *merged, deadline time.Time) map[string]any {
	for {
		read := &catalog.Request{Op: "read_command_lines", RequestID: cli.NewRequestID(), Scope: scope,
			Args: catalog.Args{"command_session_id": id, "start_offset": uint64(acc.end()), "limit": uint64(1000)}}
		out := p.call(ctx, read)
		if catalog.ErrorFromResponse(out) != nil {
			return nil
		}
		if !running(out) || intOf(out["end_offset"]) > acc.end() || time.Now().After(deadline) {
			return out
		}
		select {
		case <-ctx.Done():
			return out
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// interrupt cancels a command whose exec_command call was cancelled.
func (p *projection) interrupt(ctx context.Context, r *catalog.Request, id string) {
	if id == "" {
		return
	}
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	p.call(c, &catalog.Request{Op: "write_command_stdin", RequestID: cli.NewRequestID(), Scope: r.Scope,
		Args: catalog.Args{"command_session_id": id, "stdin": "\u0003", "yield_time_ms": uint64(1000)}})
}

// ceilMs is d in whole milliseconds, rounded up: a last slice rounded down
// would end just short of the yield and add a slice of 1 ms.
func ceilMs(d time.Duration) uint64 {
	return uint64(max((d+time.Millisecond-1)/time.Millisecond, 1))
}

func running(out map[string]any) bool { return out["status"] == "running" }

// merged joins consecutive command outputs of one command.
type merged struct {
	first map[string]any
	rest  []map[string]any
}

func (m *merged) add(out map[string]any) { m.rest = append(m.rest, out) }

func (m *merged) last() map[string]any {
	if len(m.rest) > 0 {
		return m.rest[len(m.rest)-1]
	}
	return m.first
}

func (m *merged) end() int { return intOf(m.last()["end_offset"]) }

func (m *merged) result(start time.Time) map[string]any {
	if len(m.rest) == 0 {
		return m.first
	}
	out := maps.Clone(m.last())
	var texts []string
	for _, o := range append([]map[string]any{m.first}, m.rest...) {
		if s, _ := o["output"].(string); s != "" || intOf(o["end_offset"]) > intOf(o["start_offset"]) {
			texts = append(texts, s)
		}
		if tb, ok := o["truncated_before"]; ok {
			out["truncated_before"] = tb
		}
	}
	text := strings.Join(texts, "\n")
	out["output"] = text
	out["start_offset"] = m.first["start_offset"]
	out["original_token_count"] = (utf8.RuneCountInString(text) + 3) / 4
	out["wall_time_seconds"] = time.Since(start).Seconds()
	return out
}

func intOf(v any) int {
	switch n := v.(type) {
	case json.Number:
		i, _ := n.Int64()
		return int(i)
	case float64:
		return int(n)
	case int:
		return n
	}
	return 0
}
