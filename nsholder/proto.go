package nsholder

// The control channel between the supervisor and a holder: one inherited
// AF_UNIX SOCK_STREAM socketpair (never a filesystem or abstract socket).
//
// Every message is a frame:
//
//	u32 header length | u64 payload length | header (JSON ctlHeader) | payload (raw bytes)
//
// little-endian. A frame that carries a descriptor (a PTY master) has
// header.FD set, and the descriptor travels as SCM_RIGHTS with the sendmsg
// that writes the frame's first bytes; the kernel delivers it with the
// recvmsg that returns those bytes, so the reader has it once it has parsed
// the prefix. A frame that carries several (the layers of a lower swap, up
// to the chain depth limit, more than one SCM_RIGHTS message may hold)
// sets header.FDs to their number instead: they travel in batches of at
// most maxFDsPerMsg, each batch with the next bytes of the frame's prefix
// and header, so all have arrived once the reader has the header. Requests carry an ID chosen by the supervisor and are served
// concurrently; the reply carries the same ID and Op "reply". Events (ID 0,
// Op "event") are pushed by the holder at any time. Payloads are file
// contents (ReadFile reply, WriteFile request), so a 256 MiB file is one
// frame that is streamed, never copied through JSON.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/fuseoverlay"
)

const (
	prefixLen     = 12
	maxFDsPerMsg  = 250     // below the kernel's SCM_MAX_FD (253)
	maxHeaderLen  = 1 << 30 // sanity bounds only: a ReadDir reply of a huge directory is large
	maxPayloadLen = 1 << 40
)

// Ops of the control protocol.
const (
	opSetup    = "setup"    // supervisor → holder: Config; reply when the root is ready
	opSpawn    = "spawn"    // SpawnRequest; reply Proc + FD (the PTY master)
	opSignal   = "signal"   // Cmd, Sig
	opQuiesce  = "quiesce"  // reply once every session process is reaped
	opLstat    = "lstat"    // Path; reply Info
	opReadFile = "readfile" // Path, Max; reply Info + payload
	opReadDir  = "readdir"  // Path; reply Infos
	opWrite    = "writefile"
	opShutdown = "shutdown"  // GraceMS; no reply: SIGTERM the session, wait, exit
	opDial     = "dial"      // Port, GraceMS (connect timeout); reply FD (a connected TCP socket)
	opSwap     = "swaplower" // Swap + FDs (the new lowers, then the new upper when Swap.Upper); reply Err
	opFreeze   = "freeze"    // Freeze; reply Err once the session is stopped and flushed
	opThaw     = "thaw"      // reply Err
	opChain    = "chain"     // reply Chain
	opReply    = "reply"
	opEvent    = "event"
)

// ctlHeader is the JSON header of every frame; each op uses a few fields.
type ctlHeader struct {
	ID  uint64 `json:"id,omitempty"`
	Op  string `json:"op"`
	FD  bool   `json:"fd,omitempty"`
	FDs int    `json:"fds,omitempty"` // number of descriptors of a multi-descriptor frame
	// fds are the received descriptors of a multi-descriptor frame; the
	// handler owns them.
	fds []int

	Config  *Config       `json:"config,omitempty"`
	Spawn   *SpawnRequest `json:"spawn,omitempty"`
	Cmd     uint64        `json:"cmd,omitempty"`
	Sig     int           `json:"sig,omitempty"`
	Path    string        `json:"path,omitempty"`
	Max     int64         `json:"max,omitempty"`
	Mode    *fs.FileMode  `json:"mode,omitempty"`
	GraceMS int64         `json:"grace_ms,omitempty"`
	Port    int           `json:"port,omitempty"`
	Swap    *swapHeader   `json:"swap,omitempty"`
	Freeze  *freezeHeader `json:"freeze,omitempty"`

	Err     *wireError  `json:"err,omitempty"`
	Info    *FileInfo   `json:"info,omitempty"`
	Infos   []FileInfo  `json:"infos,omitempty"`
	Created bool        `json:"created,omitempty"`
	Pid     int         `json:"pid,omitempty"`
	Event   *wireEvent  `json:"event,omitempty"`
	Ready   *readyState `json:"ready,omitempty"`
	Chain   *ChainInfo  `json:"chain,omitempty"`
}

type wireEvent struct {
	Cmd    uint64    `json:"cmd"`
	Exited bool      `json:"exited,omitempty"`
	Status uint32    `json:"status,omitempty"`
	Done   bool      `json:"done,omitempty"`
	FS     *FSNotice `json:"fs,omitempty"`
}

// readyState is what the holder reports with its ready handshake.
type readyState struct {
	LowerdirPlus bool   `json:"lowerdir_plus"`
	Shell        string `json:"shell,omitempty"`
	// OverlayUs is how long mounting /workspace took, in microseconds.
	OverlayUs int64 `json:"overlay_us,omitempty"`
	// Overlay is the driver that serves /workspace.
	Overlay string `json:"overlay,omitempty"`
}

// wireError carries an error across the channel so that errors.Is with the
// package's sentinels (and with a syscall.Errno) still works on the
// supervisor side, and *fs.PathError / *KindError keep their type.
type wireError struct {
	Msg   string `json:"msg"`
	Code  string `json:"code,omitempty"`
	Errno int    `json:"errno,omitempty"`
	Op    string `json:"op,omitempty"`   // *fs.PathError
	Path  string `json:"path,omitempty"` // *fs.PathError
	Kind  string `json:"kind,omitempty"` // *KindError
	// Component is set for a *SymlinkError (Path is its Path).
	Component string `json:"component,omitempty"`
	Stage     string `json:"stage,omitempty"`
	Pins      []Pin  `json:"pins,omitempty"` // *PinnedError
}

var errCodes = []struct {
	code string
	err  error
}{
	{"not_exist", ErrNotExist},
	{"not_dir", ErrNotDir},
	{"symlink", ErrSymlink},
	{"not_regular", ErrNotRegular},
	{"too_large", ErrTooLarge},
	{"no_shell", ErrNoShell},
	{"exited", ErrExited},
	{"invalid", fs.ErrInvalid},
	{"permission", fs.ErrPermission},
	{"exist", fs.ErrExist},
	{"unsupported", ErrSwapUnsupported},
	{"pinned", ErrSwapPinned},
	{"freeze_timeout", ErrFreezeTimeout},
	{"freeze_expired", ErrFreezeExpired},
	{"swap_invalidate", fuseoverlay.ErrSwapInvalidate},
	{"too_many_lowers", ErrTooManyLowers},
}

func encodeError(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Msg: err.Error()}
	var se *stageError
	if errors.As(err, &se) {
		w.Stage, w.Msg = se.stage, se.err.Error()
		return w
	}
	var sl *SymlinkError
	if errors.As(err, &sl) {
		w.Code, w.Path, w.Component = "symlink", sl.Path, sl.Component
		return w
	}
	var pinned *PinnedError
	if errors.As(err, &pinned) {
		w.Code, w.Pins = "pinned", pinned.Pins
		return w
	}
	var ke *KindError
	if errors.As(err, &ke) {
		w.Kind = ke.Kind
	}
	inner := err
	var pe *fs.PathError
	if errors.As(err, &pe) {
		w.Op, w.Path, inner = pe.Op, pe.Path, pe.Err
		w.Msg = inner.Error()
	}
	for _, c := range errCodes {
		if errors.Is(inner, c.err) {
			w.Code = c.code
			break
		}
	}
	var errno syscall.Errno
	if errors.As(inner, &errno) {
		w.Errno = int(errno)
	}
	return w
}

// remoteError is an error reported by the holder.
type remoteError struct {
	msg   string
	errs  []error
	stage string
}

func (e *remoteError) Error() string   { return e.msg }
func (e *remoteError) Unwrap() []error { return e.errs }

func (w *wireError) decode() error {
	if w == nil {
		return nil
	}
	if w.Kind != "" {
		return &KindError{Kind: w.Kind}
	}
	if w.Component != "" {
		return &SymlinkError{Path: w.Path, Component: w.Component}
	}
	if w.Code == "pinned" && len(w.Pins) > 0 {
		return &PinnedError{Pins: w.Pins}
	}
	var inner error
	re := &remoteError{msg: w.Msg, stage: w.Stage}
	for _, c := range errCodes {
		if c.code == w.Code {
			if c.err.Error() == w.Msg {
				inner = c.err
			} else {
				re.errs = append(re.errs, c.err)
			}
		}
	}
	if w.Errno != 0 {
		re.errs = append(re.errs, syscall.Errno(w.Errno))
	}
	if inner == nil {
		inner = re
	}
	if w.Op != "" {
		return &fs.PathError{Op: w.Op, Path: w.Path, Err: inner}
	}
	return inner
}

// stageError is a setup failure at one stage (SetupError on the wire).
type stageError struct {
	stage string
	err   error
}

func (e *stageError) Error() string { return e.stage + ": " + e.err.Error() }
func (e *stageError) Unwrap() error { return e.err }

func atStage(stage string, format string, a ...any) error {
	return &stageError{stage: stage, err: fmt.Errorf(format, a...)}
}

// ctlConn is one end of the channel. One goroutine reads; writers are
// serialised by wsem so a frame is never interleaved with another.
type ctlConn struct {
	uc   *net.UnixConn
	rbuf []byte
	r, w int
	oob  []byte
	fds  []int // received descriptors not yet claimed by a frame
	wsem chan struct{}
}

// newCtlConn takes ownership of f (a connected unix stream socket).
func newCtlConn(f *os.File) (*ctlConn, error) {
	nc, err := net.FileConn(f) // dups with close-on-exec
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("control channel: %w", err)
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("control channel is a %T, not a unix socket", nc)
	}
	return &ctlConn{uc: uc, rbuf: make([]byte, 64<<10), oob: make([]byte, unix.CmsgSpace(maxFDsPerMsg*4)), wsem: make(chan struct{}, 1)}, nil
}

// Close closes the socket; a blocked readFrame returns an error.
func (c *ctlConn) Close() error { return c.uc.Close() }

// dropFDs closes received descriptors no frame claimed; reader only.
func (c *ctlConn) dropFDs() {
	for _, fd := range c.fds {
		unix.Close(fd)
	}
	c.fds = nil
}

// recv reads into p with recvmsg, collecting any descriptors.
func (c *ctlConn) recv(p []byte) (int, error) {
	n, oobn, _, _, err := c.uc.ReadMsgUnix(p, c.oob)
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(c.oob[:oobn])
		if perr == nil {
			for _, m := range msgs {
				fds, ferr := unix.ParseUnixRights(&m)
				if ferr != nil {
					continue
				}
				for _, fd := range fds {
					unix.CloseOnExec(fd)
				}
				c.fds = append(c.fds, fds...)
			}
		}
	}
	if n == 0 && err == nil {
		err = io.EOF
	}
	if n > 0 {
		err = nil
	}
	return n, err
}

func (c *ctlConn) readFull(p []byte) error {
	for len(p) > 0 {
		if c.r < c.w {
			k := copy(p, c.rbuf[c.r:c.w])
			c.r += k
			p = p[k:]
			continue
		}
		c.r, c.w = 0, 0
		if len(p) >= len(c.rbuf) { // large payloads go straight to their buffer
			n, err := c.recv(p)
			if err != nil {
				return err
			}
			p = p[n:]
			continue
		}
		n, err := c.recv(c.rbuf)
		if err != nil {
			return err
		}
		c.w = n
	}
	return nil
}

// readFrame reads the next frame. fd is -1 unless the frame carries one.
func (c *ctlConn) readFrame() (hdr *ctlHeader, payload []byte, fd int, err error) {
	var pre [prefixLen]byte
	if err := c.readFull(pre[:]); err != nil {
		return nil, nil, -1, err
	}
	hl := binary.LittleEndian.Uint32(pre[0:4])
	pl := binary.LittleEndian.Uint64(pre[4:12])
	if hl > maxHeaderLen || pl > maxPayloadLen {
		return nil, nil, -1, fmt.Errorf("control channel: bad frame (header %d, payload %d bytes)", hl, pl)
	}
	hb := make([]byte, hl)
	if err := c.readFull(hb); err != nil {
		return nil, nil, -1, unexpected(err)
	}
	hdr = new(ctlHeader)
	if err := json.Unmarshal(hb, hdr); err != nil {
		return nil, nil, -1, fmt.Errorf("control channel: bad header: %w", err)
	}
	if pl > 0 {
		payload = make([]byte, pl)
		if err := c.readFull(payload); err != nil {
			return nil, nil, -1, unexpected(err)
		}
	}
	fd = -1
	if hdr.FD {
		if len(c.fds) == 0 {
			return nil, nil, -1, errors.New("control channel: frame announces a descriptor that did not arrive")
		}
		fd, c.fds = c.fds[0], c.fds[1:]
	}
	if hdr.FDs > 0 {
		if len(c.fds) < hdr.FDs {
			return nil, nil, -1, fmt.Errorf("control channel: frame announces %d descriptors, %d arrived", hdr.FDs, len(c.fds))
		}
		hdr.fds = append([]int(nil), c.fds[:hdr.FDs]...)
		c.fds = c.fds[hdr.FDs:]
	}
	return hdr, payload, fd, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// writeFrame writes one frame; fd (if ≥ 0) travels with its first bytes.
// ctx bounds only the wait for the channel: a frame once started is
// finished, or the channel would be corrupt.
func (c *ctlConn) writeFrame(ctx context.Context, hdr *ctlHeader, payload []byte, fd int) error {
	var fds []int
	if fd >= 0 {
		fds = []int{fd}
	}
	return c.writeFrameFDs(ctx, hdr, payload, fds, false)
}

// writeFrameFDs writes one frame with any number of descriptors: one as
// header.FD, several (multi set) as header.FDs, in batches that ride on
// the frame's first bytes, one byte per batch but the last.
func (c *ctlConn) writeFrameFDs(ctx context.Context, hdr *ctlHeader, payload []byte, fds []int, multi bool) error {
	hdr.FD = len(fds) == 1 && !multi
	hdr.FDs = 0
	if multi {
		hdr.FDs = len(fds)
	}
	hb, err := json.Marshal(hdr)
	if err != nil {
		return fmt.Errorf("control channel: encode %s: %w", hdr.Op, err)
	}
	buf := make([]byte, prefixLen, prefixLen+len(hb))
	binary.LittleEndian.PutUint32(buf[0:4], uint32(len(hb)))
	binary.LittleEndian.PutUint64(buf[4:12], uint64(len(payload)))
	buf = append(buf, hb...)
	select {
	case c.wsem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.wsem }()
	for len(fds) > 0 {
		batch := fds[:min(len(fds), maxFDsPerMsg)]
		fds = fds[len(batch):]
		chunk := buf
		if len(fds) > 0 {
			chunk = buf[:1] // more batches follow, each needs bytes of its own
		}
		n, _, err := c.uc.WriteMsgUnix(chunk, unix.UnixRights(batch...), nil)
		if err != nil {
			return fmt.Errorf("control channel: send %s: %w", hdr.Op, err)
		}
		buf = buf[n:]
		if len(buf) == 0 && len(fds) > 0 {
			return fmt.Errorf("control channel: send %s: frame too short for its descriptors", hdr.Op)
		}
	}
	if len(buf) > 0 {
		if _, err := c.uc.Write(buf); err != nil {
			return fmt.Errorf("control channel: send %s: %w", hdr.Op, err)
		}
	}
	if len(payload) > 0 {
		if _, err := c.uc.Write(payload); err != nil {
			return fmt.Errorf("control channel: send %s payload: %w", hdr.Op, err)
		}
	}
	return nil
}
