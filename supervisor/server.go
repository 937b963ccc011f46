package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/doctor"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/images"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/rpc"
	sbx "github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/web"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// Options are the command-line inputs of `sandbox-supervisor serve`.
type Options struct {
	ConfigPath string // --config; default <config dir>/config.yml
	Endpoint   string // --endpoint; default SANDBOX_SUPERVISOR_SOCKET, config, runtime dir
	Listen     string // --listen tcp://HOST:PORT (loopback); default supervisor.listen
	HTTP       string // --http tcp://HOST:PORT (loopback); default http.listen
	Version    string
	Logger     *slog.Logger
	// Ready is called once the listener accepts requests (after recovery).
	Ready func(socket string)
	// Listener, when set, is a Unix socket passed by systemd socket
	// activation (§2.1): used as is instead of binding one, and left in
	// place on shutdown.
	Listener net.Listener
	// Counts, when set, is called once before Ready with a function that
	// reports live counts (for systemd STATUS= lines).
	Counts func(get func() Counts)
}

// Supervisor is the running daemon: one per user and data directory.
type Supervisor struct {
	cfg     *config.Config
	dirs    catalog.Dirs
	log     *slog.Logger
	ids     *statedb.IDs
	store   *store
	obs     *obsRegistry // event/span stores (§10.1); nil-safe
	cgroups *cgroups     // delegated cgroup subtree (§10.2); nil-safe
	version string
	started time.Time
	probes  doctor.Probes
	self    string // path of the running binary, for holders and probes
	// shimPath is sandbox-exec-shim next to self, the exec shim of every
	// command; "" when missing (holders then use self: slower start).
	shimPath string
	// shimLoader starts the Go shim in image roots when shimPath is ""
	// and self is dynamically linked (nsholder.GoShimLoader); shimErr says
	// why there is none when one is needed.
	shimLoader *nsholder.ShimLoader
	shimErr    error

	mu        sync.Mutex
	admission *workspace.Admission // check-and-reserve of commands and sessions
	holders   *workspace.Holders   // session creation, holders, restore at start
	publisher *workspace.Publisher // publish and implicit finalization
	glue      *attrGlue            // attribution's view of sandboxes and sessions
	cmds      *workspace.Commands  // ends, retains and looks up commands
	teardown  *workspace.Teardown  // destroys sessions, stops a sandbox's sessions
	sandboxes *sbx.Registry[*occupants]
	squasher  *sbx.Squasher[*occupants]
	sbm       *sbx.Manager[*occupants]
	exporter  *sbx.Exporter[*occupants] // export_changes dir/tar; serializes exports per sandbox
	protected *layers.Patterns          // runtime.publish.protected_paths, compiled once
	images    *images.Cache             // image → rootfs cache (§4.2 step 2)
	docker    dockerProbe               // Docker Engine reachability at start (health)

	draining atomic.Bool
	inflight sync.WaitGroup
	conns    chan struct{} // connection slots (max_concurrent_connections)
	fds      *fdGuard      // descriptor exhaustion: a reserve, and refusal of new work (fdguard.go)
	active   atomic.Int64  // requests being executed

	mux          *rpc.Mux // the handlers, registered against the catalog (dispatch.go)
	gatewayToken []byte   // TCP peers must present it (§2.2); never logged
	httpBase     string   // http://host:port of the HTTP listener, "" without one; set before serving
}

// Serve runs the supervisor until ctx is cancelled, then shuts down cleanly:
// it stops accepting, answers new requests with server_shutting_down, lets
// in-flight requests finish (bounded by supervisor.shutdown_grace_s) and
// removes its socket and pid file. Start-up refusals are *catalog.Error with
// kind config_error.
func Serve(ctx context.Context, opt Options) error {
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	dirs, err := catalog.ResolveDirs()
	if err != nil {
		return err
	}
	cfgPath := opt.ConfigPath
	if cfgPath == "" {
		cfgPath = filepath.Join(dirs.Config, "config.yml")
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	tcpAddr, err := listenAddr("--listen", opt.Listen, cfg.Supervisor.Listen)
	if err != nil {
		return err
	}
	httpAddr, err := listenAddr("--http", opt.HTTP, cfg.HTTP.Listen)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dirs.Data, 0o700); err != nil {
		return catalog.Errorf(catalog.ConfigError, "create data directory %s: %w", dirs.Data, err)
	}
	unlock, err := lockDataDir(dirs.Data)
	if err != nil {
		return err
	}
	defer unlock()
	if err := ensureTokens(dirs.Config); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return catalog.Errorf(catalog.ConfigError, "cannot find the running binary: %w", err)
	}
	workspace.SetTreeSelf(self)
	st, err := openStore(ctx, dirs.Data)
	if err != nil {
		return catalog.Errorf(catalog.ConfigError, "%w", err)
	}
	defer st.Close()

	s := &Supervisor{
		cfg: cfg, dirs: dirs, log: log, ids: statedb.NewIDs(), store: st, version: opt.Version,
		started: time.Now(), self: self, sandboxes: sbx.NewRegistry[*occupants](),
		conns: make(chan struct{}, cfg.Supervisor.MaxConcurrentConnections),
		fds:   newFDGuard(),
	}
	if s.mux, err = s.newMux(); err != nil {
		return catalog.Errorf(catalog.InternalError, "%w", err)
	}
	s.protected = layers.CompilePatterns(cfg.Runtime.Publish.ProtectedPaths)
	s.squasher = s.newSquasher()
	s.sbm = s.newSandboxManager()
	s.admission = workspace.NewAdmission(cfg, s.allSandboxes)
	s.exporter = &sbx.Exporter[*occupants]{Reg: s.sandboxes, Log: log}
	s.obs = newObsRegistry(cfg, dirs.Data, log, s.ids) // stores are created on first append
	s.shimPath = nsholder.ExecShimNextTo(self)
	if s.shimPath == "" {
		if s.shimLoader, s.shimErr = nsholder.GoShimLoader(self); s.shimErr != nil {
			log.Warn("no exec shim for image sandboxes", "err", s.shimErr)
		}
	}
	s.probes = doctor.RunProbes(ctx, self, dirs.Data, log)
	if err := s.openImages(ctx); err != nil {
		return err
	}
	s.cgroups = setupCgroups("/sys/fs/cgroup", "/proc/self/cgroup")
	s.glue = &attrGlue{cfg: cfg, store: st, log: log, recordLayerOrigin: s.recordLayerOrigin}
	s.cmds = &workspace.Commands{Cfg: cfg, DB: st.DB, Log: log, Data: dirs.Data, IDs: s.ids, Obs: s.obs, Attr: sessionHooks{s}, Bump: s.bump,
		Revise: s.revise}
	s.publisher = &workspace.Publisher{Cfg: cfg, DB: st.DB, Log: log, Obs: s.obs, Protected: s.protected, Attr: publishHooks{s}, Bump: s.bump,
		Revise: s.revise}
	s.teardown = &workspace.Teardown{Cfg: cfg, DB: st.DB, Log: log, Obs: s.obs, Cgroups: s.cgroups, Cmds: s.cmds, Bump: s.bump,
		FinalizeImplicit: s.publisher.FinalizeImplicit}
	s.publisher.Teardown = s.teardown
	s.holders = &workspace.Holders{Cfg: cfg, DB: st.DB, Log: log, Obs: s.obs, IDs: s.ids, Admission: s.admission, Cmds: s.cmds,
		Teardown: s.teardown, Self: s.self, Shim: s.shimPath, ShimLoader: s.shimLoader, ShimErr: s.shimErr, Hidden: []string{dirs.Data, dirs.Config, dirs.Runtime},
		Cgroups: s.cgroups, FuseNotices: s.glue.fuseNotices, FinalizeImplicit: s.publisher.FinalizeImplicit, Bump: s.bump,
		ImageRootfs: func(ref string) (string, error) {
			img, err := s.images.Lookup(ref)
			if err != nil {
				return "", err
			}
			return img.Rootfs, nil
		}}
	s.publisher.Remount = s.holders.Remount
	s.teardown.RefillSpare = s.holders.RefillSpare
	log.Info("cgroups", "delegated", s.cgroups.Delegated, "root", s.cgroups.Root, "reason", s.cgroups.Reason)
	if err := s.recover(ctx); err != nil {
		return err
	}
	eventIn(s.obs, nil, "", "supervisor.boot", map[string]any{"version": s.version, "probes": map[string]any{
		"user_namespaces": s.probes.UserNS, "kernel_overlay": s.probes.KernelOverlay, "lowerdir_plus": s.probes.LowerdirPlus,
		"fuse_device": s.probes.FuseDevice, "fuse_overlay": s.probes.FuseOverlay,
		"cgroup": map[string]any{"delegated": s.cgroups.Delegated, "reason": s.cgroups.Reason}}})

	var socket string
	ln := opt.Listener
	if ln != nil {
		socket = ln.Addr().String()
	} else {
		if socket, err = s.socketPath(opt.Endpoint); err != nil {
			return err
		}
		if err := prepareSocket(socket); err != nil {
			return err
		}
	}
	// A client takes a connectable socket for a running supervisor (the
	// autostart and the tests wait for exactly that), so every file it may
	// read next — listen.addr, the pid file — is complete before the socket
	// exists. An activated socket already accepts; nothing is served from it
	// before the accept loop below.
	runDir := filepath.Dir(socket)
	var tcp net.Listener
	if tcpAddr != "" {
		if s.gatewayToken, err = readToken(dirs.Config, "gateway.token"); err == nil {
			tcp, err = tcpListen(tcpAddr, runDir, "listen.addr")
		}
		if err != nil {
			return err
		}
		defer tcp.Close()
		defer os.Remove(filepath.Join(runDir, "listen.addr"))
		log.Info("supervisor listening on TCP", "addr", tcpAddrString(tcp))
	}
	var httpSrv *web.Server
	if httpAddr == "" {
		// A crashed supervisor's http.addr must not send `ui` users to a
		// port someone else may hold now.
		_ = os.Remove(filepath.Join(runDir, "http.addr"))
	} else {
		if httpSrv, err = s.newHTTP(httpAddr, runDir, tcp); err != nil {
			return err
		}
		defer os.Remove(filepath.Join(runDir, "http.addr"))
	}
	pidFile := filepath.Join(runDir, "supervisor.pid")
	if err := writeRuntimeFile(pidFile, fmt.Appendf(nil, "%d\n", os.Getpid())); err != nil {
		return catalog.Errorf(catalog.ConfigError, "write pid file %s: %w", pidFile, err)
	}
	defer os.Remove(pidFile)
	if ln == nil {
		if ln, err = bindUnix(socket); err != nil {
			return err
		}
	}
	log.Info("supervisor listening", "socket", socket, "pid", os.Getpid(), "data", dirs.Data)
	if opt.Counts != nil {
		opt.Counts(s.counts)
	}
	if opt.Ready != nil {
		opt.Ready(socket)
	}

	go s.runSampler(ctx) // stops when ctx ends, before shutdown tears sessions down
	var accepting sync.WaitGroup
	accepting.Go(func() { s.acceptLoop(ctx, ln, false) })
	if tcp != nil {
		accepting.Go(func() { s.acceptLoop(ctx, tcp, true) })
	}
	if httpSrv != nil {
		accepting.Go(func() {
			if err := httpSrv.Serve(); err != nil {
				log.Error("HTTP listener failed", "err", err)
			}
		})
	}
	<-ctx.Done()
	log.Info("supervisor shutting down")
	s.draining.Store(true)
	ln.Close()
	if tcp != nil {
		tcp.Close()
	}
	if httpSrv != nil {
		// Like the socket's in-flight requests, HTTP requests finish; event
		// streams end now.
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(cfg.Supervisor.ShutdownGraceS*float64(time.Second))+30*time.Second)
		httpSrv.Shutdown(hctx)
		cancel()
	}
	accepting.Wait()
	s.waitInflight(time.Duration(cfg.Supervisor.ShutdownGraceS * float64(time.Second)))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(cfg.Supervisor.ShutdownGraceS*float64(time.Second)))
	s.shutdown(sctx)
	cancel()
	if opt.Listener == nil {
		os.Remove(socket)
	}
	log.Info("supervisor stopped")
	return nil
}

func (s *Supervisor) waitInflight(grace time.Duration) {
	done := make(chan struct{})
	go func() { s.inflight.Wait(); close(done) }()
	// In-flight requests finish: a publish or snapshot is never cut short.
	// The grace only bounds how long we wait for idle connections to send.
	select {
	case <-done:
	case <-time.After(grace + 30*time.Second):
		s.log.Warn("in-flight requests still running after the shutdown grace")
	}
}

func (s *Supervisor) socketPath(flag string) (string, error) {
	raw := flag
	if raw == "" {
		raw = os.Getenv("SANDBOX_SUPERVISOR_SOCKET")
	}
	if raw == "" {
		raw = s.cfg.Supervisor.SocketPath
	}
	if raw == "" {
		raw = s.dirs.SocketPath()
	}
	ep, err := catalog.ParseEndpoint(raw)
	if err != nil {
		return "", err
	}
	if ep.Network != "unix" {
		return "", catalog.Errorf(catalog.ConfigError, "--endpoint must be a Unix socket path; use --listen for TCP")
	}
	return ep.Address, nil
}

// prepareSocket readies the socket's place (§2.1): its directory is created
// 0700 or must already be a real directory of ours with mode 0700; a stale
// socket is removed, a live one refuses the start. It writes nothing into a
// directory that failed the check.
func prepareSocket(socket string) error {
	dir := filepath.Dir(socket)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return catalog.Errorf(catalog.ConfigError, "create %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return catalog.Errorf(catalog.ConfigError, "create socket directory %s: %w", dir, err)
	}
	if err := catalog.CheckPrivateDir("socket directory", dir); err != nil {
		var ce *catalog.Error
		if errors.As(err, &ce) {
			return ce
		}
		return catalog.Errorf(catalog.ConfigError, "%w", err)
	}
	if conn, err := net.DialTimeout("unix", socket, time.Second); err == nil {
		conn.Close()
		return catalog.Errorf(catalog.ConfigError, "another supervisor is already answering on %s", socket)
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return catalog.Errorf(catalog.ConfigError, "remove stale socket %s: %w", socket, err)
	}
	return nil
}

// bindUnix creates the socket (prepared by prepareSocket) under umask 0177.
func bindUnix(socket string) (net.Listener, error) {
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", socket)
	unix.Umask(old)
	if err != nil {
		return nil, catalog.Errorf(catalog.ConfigError, "listen on %s: %w", socket, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	return ln, nil
}

// writeRuntimeFile puts data at p all at once: a reader sees the whole file
// or none, and an existing symlink at p is replaced, never followed.
func writeRuntimeFile(p string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}

// acceptLoop serves one listener; tcp marks the token-authenticated TCP
// listener (no peer uid, a gateway token on every request). Requests run
// on contexts derived from ctx without its cancellation: at shutdown
// in-flight requests finish.
func (s *Supervisor) acceptLoop(ctx context.Context, ln net.Listener, tcp bool) {
	for {
		conn, err := ln.Accept()
		pressure := false
		if err != nil && fdExhausted(err) && s.fds.release() {
			// Out of descriptors: answer the waiting client with the
			// reserve's (fdguard.go).
			conn, err = ln.Accept()
			pressure = true
			s.fds.refill()
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if !fdExhausted(err) || s.fds.warnDue() {
				s.log.Warn("accept failed", "err", err)
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !pressure && s.fds.pressured(conn) {
			pressure = true
		}
		if pressure && s.fds.warnDue() {
			s.log.Warn("out of file descriptors: refusing new work", "max_open_files", s.fds.limit)
		}
		select {
		case s.conns <- struct{}{}:
		default:
			go s.refuse(conn, catalog.Errorf(catalog.ServerBusy, "too many concurrent connections").
				With("max_concurrent_connections", s.cfg.Supervisor.MaxConcurrentConnections))
			continue
		}
		s.inflight.Add(1)
		go func() {
			defer func() { <-s.conns; s.inflight.Done() }()
			if pressure {
				defer s.fds.refill()
			}
			s.serveConn(context.WithoutCancel(ctx), conn, tcp, pressure)
		}()
	}
}

func (s *Supervisor) refuse(conn net.Conn, e *catalog.Error) {
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = conn.Write(append(e.MarshalEnvelope(), '\n'))
}

// peerUID reads SO_PEERCRED of a Unix connection.
func peerUID(conn net.Conn) (int, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return -1, fmt.Errorf("not a unix connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, cerr
	}
	return int(cred.Uid), nil
}

// serveConn answers the one request of conn; ctx is the connection's
// context, which rpc cancels when the client hangs up.
//
// pressure marks a connection accepted at the descriptor limit: it has
// little time to send its request, and only health is served.
func (s *Supervisor) serveConn(ctx context.Context, conn net.Conn, tcp, pressure bool) {
	defer conn.Close()
	if !tcp {
		uid, err := peerUID(conn)
		if err != nil || uid != os.Geteuid() {
			if err != nil {
				uid = -1
			}
			s.refuse(conn, catalog.Errorf(catalog.Unauthorized, "peer uid %d is not the supervisor owner", uid))
			return
		}
	}
	w := rpc.NewLineWriter(conn)
	timeout := time.Duration(s.cfg.Supervisor.RequestReadTimeoutS * float64(time.Second))
	if pressure {
		timeout = min(timeout, fdPressureTimeout)
	}
	_ = conn.SetReadDeadline(time.Now().Add(timeout))
	line, rerr := rpc.ReadLine(bufio.NewReaderSize(conn, 64<<10), s.cfg.Supervisor.MaxRequestBytes)
	_ = conn.SetReadDeadline(time.Time{})
	if rerr != nil {
		w.Final(rerr)
		return
	}
	if pressure && !servedUnderPressure[pressureOp(line)] {
		w.Final(s.fds.busyError())
		return
	}
	if s.draining.Load() {
		w.Final(catalog.Errorf(catalog.ServerShuttingDown, "the supervisor is shutting down"))
		return
	}
	s.active.Add(1)
	defer s.active.Add(-1)
	w.Final(s.mux.Serve(line, rpc.Origin{TCP: tcp, Progress: w.Progress,
		Conn: func() (context.Context, func()) { return rpc.WatchHangup(ctx, conn) }}))
}
