package resources

// Readers of /proc and of other small kernel files. Every read is bounded;
// none reads a process's cmdline or environment.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ClockTicks is USER_HZ, the unit of /proc/<pid>/stat times. It is 100 on
// every architecture Linux supports for user space (sysconf needs cgo).
const ClockTicks = 100

// ProcStat is what the sampler and the views read of one process.
type ProcStat struct {
	Pid, PPid      int
	Name, State    string
	UTime, STime   uint64 // clock ticks
	StartTicks     uint64 // since boot
	Threads        int
	VMRSS, VMSize  int64 // bytes
	VMHWM, RSSAnon int64
	NSPid          int // the PID in its innermost namespace (0 when unknown)
}

func (p ProcStat) CPUTimeUs() uint64 { return (p.UTime + p.STime) * (1_000_000 / ClockTicks) }

var procStates = map[byte]string{
	'R': "running", 'S': "sleeping", 'D': "disk_sleep", 'Z': "zombie", 'T': "stopped",
	't': "tracing_stop", 'X': "dead", 'x': "dead", 'K': "wakekill", 'W': "waking", 'P': "parked", 'I': "idle",
}

// ReadProc reads /proc/<pid>/stat and /proc/<pid>/status (never cmdline or
// environ). dir is "/proc/<pid>" or "/proc/self".
func ReadProc(dir string) (ProcStat, error) {
	var p ProcStat
	buf, err := ReadSmall(filepath.Join(dir, "stat"), 4096)
	if err != nil {
		return p, err
	}
	if err := parseStat(buf, &p); err != nil {
		return p, fmt.Errorf("%s/stat: %w", dir, err)
	}
	buf, err = ReadSmall(filepath.Join(dir, "status"), 16384)
	if err != nil {
		return p, err
	}
	parseStatus(buf, &p)
	return p, nil
}

// ReadSmall reads at most max bytes of a small (proc) file.
func ReadSmall(name string, max int) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, max)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:n], nil
}

// parseStat parses /proc/<pid>/stat: "pid (comm) state ppid …"; comm may
// contain spaces and parentheses, so it ends at the last ')'.
func parseStat(b []byte, p *ProcStat) error {
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return errors.New("malformed")
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
	if err != nil {
		return errors.New("malformed pid")
	}
	p.Pid, p.Name = pid, s[open+1:closing]
	f := strings.Fields(s[closing+1:])
	// f[0] is field 3 (state); field n is f[n-3].
	if len(f) < 20 {
		return errors.New("short")
	}
	if len(f[0]) > 0 {
		if st, ok := procStates[f[0][0]]; ok {
			p.State = st
		} else {
			p.State = f[0]
		}
	}
	p.PPid, _ = strconv.Atoi(f[1])
	p.UTime, _ = strconv.ParseUint(f[14-3], 10, 64)
	p.STime, _ = strconv.ParseUint(f[15-3], 10, 64)
	p.Threads, _ = strconv.Atoi(f[20-3])
	p.StartTicks, _ = strconv.ParseUint(f[22-3], 10, 64)
	return nil
}

func parseStatus(b []byte, p *ProcStat) {
	kb := func(v string) int64 {
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		return n * 1024
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "VmRSS":
			p.VMRSS = kb(v)
		case "VmSize":
			p.VMSize = kb(v)
		case "VmHWM":
			p.VMHWM = kb(v)
		case "RssAnon":
			p.RSSAnon = kb(v)
		case "Threads":
			p.Threads, _ = strconv.Atoi(strings.TrimSpace(v))
		case "NSpid":
			if f := strings.Fields(v); len(f) > 0 {
				p.NSPid, _ = strconv.Atoi(f[len(f)-1])
			}
		}
	}
}

// NSID identifies a namespace: device and inode of /proc/<pid>/ns/<kind>.
type NSID struct {
	Device uint64 `json:"device"`
	Inode  uint64 `json:"inode"`
}

// StatNS identifies the namespace of kind that the process of pidDir is in.
func StatNS(pidDir, kind string) (NSID, error) {
	var st unix.Stat_t
	if err := unix.Stat(pidDir+"/ns/"+kind, &st); err != nil {
		return NSID{}, err
	}
	return NSID{Device: st.Dev, Inode: st.Ino}, nil
}

// CgroupLines returns the lines of /proc/<pid>/cgroup.
func CgroupLines(pidDir string) []string {
	out := []string{}
	b, err := ReadSmall(pidDir+"/cgroup", 8192)
	if err != nil {
		return out
	}
	for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// ReadNames lists at most max names of dir, sorted.
func ReadNames(dir string, max int) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(max)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}
