package supervisor

// Network profiles (contract amendment A3) and port forwards (§3.6).
//
//   - shared: the user's network namespace.
//   - isolated: the session's own namespace, connected by pasta or
//     slirp4netns (nsholder/net.go says what is and is not reachable).
//     network.isolated.helper picks one (auto: pasta, else slirp4netns);
//     a missing helper fails the creation with operation_failed at stage
//     "network" naming the Debian package, never a silent fallback.
//   - offline: the session's own namespace with only lo.
//
// network.isolated.allow_private defaults to false: an agent needs the
// public registries and DNS, while the private ranges hold what a
// sandboxed command should not probe — the LAN, the host's own non-loopback
// addresses (docker0, libvirt, VPN interfaces), cloud metadata at
// 169.254.169.254. A company registry on a private address needs true.
//
// Forwards: for a session with its own namespace the supervisor listens on
// 127.0.0.1:0 and relays each accepted connection through the holder
// (dialSession, also the seam for the HTTP /forward/isolated=… routes).
// The relay copies in both directions with half-closes; TCP flow control
// is the back-pressure (a slow reader stops the copy, the kernel buffers
// fill, the writer waits). Nothing of a connection survives it: both
// descriptors are closed when both directions are done.

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// netHelperStatus is health's "network" entry.
func (s *Supervisor) netHelperStatus() map[string]any {
	out := map[string]any{"profiles": []string{workspace.NetShared, workspace.NetIsolated, workspace.NetOffline}, "allow_private": s.cfg.Network.Isolated.AllowPrivate}
	if e, err := workspace.FindNetHelper(s.cfg.Network.Isolated.Helper); err != nil {
		out["isolated"] = map[string]any{"available": false, "helper": nil, "reason": err.Error()}
	} else {
		out["isolated"] = map[string]any{"available": true, "helper": e.Helper, "path": e.Path, "reason": nil}
	}
	return out
}

func (s *Supervisor) forwardPort(c *call) (any, error) {
	target := int(c.args.Uint("port"))
	if !c.args.Has("workspace_session_id") {
		return map[string]any{"workspace_session_id": nil, "network_profile": workspace.NetShared, "target_port": target,
			"host": "127.0.0.1", "port": target, "url": s.forwardURL("shared", target)}, nil
	}
	ss, e := workspace.LookupSession(c.sb, c.args.String("workspace_session_id"))
	if e != nil {
		return nil, e
	}
	if e := ss.Admit(); e != nil {
		return nil, e
	}
	res := map[string]any{"workspace_session_id": ss.ID(), "network_profile": ss.Rec.NetworkProfile, "target_port": target,
		"host": "127.0.0.1", "url": nil}
	if ss.Rec.NetworkProfile == workspace.NetShared {
		res["port"], res["url"] = target, s.forwardURL("shared", target)
		return res, nil
	}
	if ss.Rec.NetworkProfile == workspace.NetIsolated {
		// offline sessions have no /forward route (§2.8): url stays null.
		res["url"] = s.forwardURL("isolated="+ss.ID(), target)
	}
	f, existed, e := ss.AddForward(target)
	if e != nil {
		return nil, e
	}
	res["port"] = f.Port()
	if !existed {
		dial := func(ctx context.Context, port int) (net.Conn, error) {
			return ss.Dial(ctx, port, time.Duration(s.cfg.HTTP.Forward.ConnectTimeoutS*float64(time.Second)))
		}
		go f.Serve(context.WithoutCancel(c.ctx), dial, s.log.With("workspace_session_id", ss.ID()))
		eventCtxIn(s.obs, c.ctx, c.sb, "forward.opened", map[string]any{"workspace_session_id": ss.ID(), "target_port": target, "port": f.Port()})
	}
	return res, nil
}

// forwardURL is the /forward/<kind>/<port>/ URL of §2.8 on the HTTP
// listener, or nil without one.
func (s *Supervisor) forwardURL(kind string, port int) any {
	if s.httpBase == "" {
		return nil
	}
	return fmt.Sprintf("%s/forward/%s/%d/", s.httpBase, kind, port)
}
