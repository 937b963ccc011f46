/*
 * sandbox-exec-shim: the exec shim of every session command.
 *
 *     sandbox-exec-shim [-C DIR] [-P NPROC] -- ARGV...
 *
 * A session holder starts each command through it (as /proc/self/fd/3, with
 * every capability of the session's user namespace). It sets RLIMIT_NPROC
 * to NPROC (the session's pids limit where no cgroup enforces it: the
 * kernel counts the tasks of the session's user namespace), changes to DIR,
 * resolves ARGV[0] on $PATH when it has no '/', marks every descriptor >= 3
 * close-on-exec, hardens itself (contract §6.2: no_new_privs, the bounding
 * set dropped to the kept capabilities, the ambient set cleared, the seccomp
 * filter with TSYNC, capset to the kept mask), checks that all of it holds,
 * and execs ARGV with its environment. On any failure it prints one line,
 * "sandbox: cannot start command: <reason>", and exits 126: the command
 * never runs unhardened.
 *
 * It is the C twin of the Go shim.Run (package nsholder/shim), which stays
 * as the fallback (`sandbox-supervisor nsholder shim`) and is held to the
 * same tests. What it enforces is not written here: the kept-capability
 * mask and the seccomp program come from harden.h, generated from the Go
 * tables (go generate ./nsholder/shim), the one audited source.
 *
 * Every command pays this program's start, so it is freestanding: no libc,
 * its own _start and system calls (build.sh). A static Go binary spends
 * about 1 ms starting its runtime; a static glibc one about 0.6 ms here,
 * nearly all in its start-up CPU-feature probing (CPUID traps to the
 * hypervisor in a VM); this one about 0.05 ms. Static, it also runs inside
 * an image sandbox's root, which need not have a compatible libc. It is
 * single-threaded, allocates nothing, and reads no file but
 * /proc/sys/kernel/cap_last_cap (and /proc/self/fd on kernels without
 * close_range).
 */
#include <asm/stat.h>
#include <asm/unistd.h>
#include <linux/capability.h>
#include <linux/errno.h>
#include <linux/fcntl.h>
#include <linux/filter.h>
#include <linux/prctl.h>
#include <linux/seccomp.h>
#include <linux/stat.h>
#include <linux/types.h>

#include "harden.h"

/* Older kernel headers lack these; the values are the kernel's ABI. */
#ifndef __NR_close_range
#define __NR_close_range 436 /* the same on every architecture */
#endif
#ifndef __NR_faccessat2
#define __NR_faccessat2 439 /* likewise */
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#endif
#ifndef PR_CAP_AMBIENT_CLEAR_ALL
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif
#ifndef SECCOMP_FILTER_FLAG_TSYNC
#define SECCOMP_FILTER_FLAG_TSYNC (1UL << 0)
#endif
#define X_OK 1
#define PATH_MAX 4096

/* ------------------------------------------------------------------------
 * Entry point and system calls. A raw call returns -errno on failure.
 */

__attribute__((noreturn, used)) void shim_main(long *sp);

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl _start\n"
        "_start:\n"
        "	xor %ebp, %ebp\n"
        "	mov %rsp, %rdi\n" /* argc, argv..., NULL, envp..., NULL */
        "	and $-16, %rsp\n"
        "	call shim_main\n"
        "	hlt\n");

static long sys6(long n, long a, long b, long c, long d, long e, long f) {
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	long ret;
	__asm__ volatile("syscall"
	                 : "=a"(ret)
	                 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
	                 : "rcx", "r11", "memory");
	return ret;
}
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl _start\n"
        "_start:\n"
        "	mov x29, #0\n"
        "	mov x30, #0\n"
        "	mov x0, sp\n" /* argc, argv..., NULL, envp..., NULL */
        "	bl shim_main\n"
        "	brk #0\n");

static long sys6(long n, long a, long b, long c, long d, long e, long f) {
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	register long x5 __asm__("x5") = f;
	__asm__ volatile("svc #0"
	                 : "+r"(x0)
	                 : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
	                 : "memory", "cc");
	return x0;
}
#else
#error "sandbox-exec-shim: no entry point or system calls for this architecture"
#endif

#define sys0(n) sys6((n), 0, 0, 0, 0, 0, 0)
#define sys1(n, a) sys6((n), (long)(a), 0, 0, 0, 0, 0)
#define sys2(n, a, b) sys6((n), (long)(a), (long)(b), 0, 0, 0, 0)
#define sys3(n, a, b, c) sys6((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define sys4(n, a, b, c, d) sys6((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define sys5(n, a, b, c, d, e) sys6((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)

static long prctl5(long op, long a) { return sys5(__NR_prctl, op, a, 0, 0, 0); }

/* The compiler may emit calls to these for struct copies and zeroing. */
void *memset(void *s, int c, unsigned long n) {
	unsigned char *p = s;
	while (n--)
		*p++ = (unsigned char)c;
	return s;
}

void *memcpy(void *d, const void *s, unsigned long n) {
	unsigned char *p = d;
	const unsigned char *q = s;
	while (n--)
		*p++ = *q++;
	return d;
}

static unsigned long slen(const char *s) {
	unsigned long n = 0;
	while (s[n])
		n++;
	return n;
}

static int seq(const char *a, const char *b) {
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

/* ------------------------------------------------------------------------
 * The failure message: one line on stderr, exit 126.
 */

static char msg[2048];
static unsigned long msglen;

static void put(const char *s) {
	for (; *s && msglen < sizeof msg - 2; s++)
		msg[msglen++] = (*s == '\n' || *s == '\r') ? ' ' : *s; /* one line, whatever DIR or ARGV[0] hold */
}

static void putu(unsigned long long v, unsigned base) {
	char buf[24];
	int i = sizeof buf;
	buf[--i] = '\0';
	do
		buf[--i] = "0123456789abcdef"[v % base];
	while ((v /= base) && i > 0);
	put(buf + i);
}

static void putd(long v) {
	if (v < 0) {
		put("-");
		putu((unsigned long long)-v, 10);
		return;
	}
	putu((unsigned long long)v, 10);
}

static void putx(unsigned long long v) {
	put("0x");
	putu(v, 16);
}

/* puterr writes errno e as Go's syscall.Errno does. */
static void puterr(long e) {
	static const struct {
		int no;
		const char *text;
	} names[] = {
	    {EPERM, "operation not permitted"},
	    {ENOENT, "no such file or directory"},
	    {EINTR, "interrupted system call"},
	    {EIO, "input/output error"},
	    {E2BIG, "argument list too long"},
	    {ENOEXEC, "exec format error"},
	    {EBADF, "bad file descriptor"},
	    {ENOMEM, "cannot allocate memory"},
	    {EACCES, "permission denied"},
	    {EFAULT, "bad address"},
	    {ENOTDIR, "not a directory"},
	    {EISDIR, "is a directory"},
	    {EINVAL, "invalid argument"},
	    {ENFILE, "too many open files in system"},
	    {EMFILE, "too many open files"},
	    {ETXTBSY, "text file busy"},
	    {ENAMETOOLONG, "file name too long"},
	    {ENOSYS, "function not implemented"},
	    {ELOOP, "too many levels of symbolic links"},
	    {ESRCH, "no such process"},
	    {EAGAIN, "resource temporarily unavailable"},
	};
	for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
		if (names[i].no == e) {
			put(names[i].text);
			return;
		}
	put("errno ");
	putd(e);
}

__attribute__((noreturn)) static void die(void) {
	msg[msglen++] = '\n';
	for (unsigned long off = 0; off < msglen;) {
		long w = sys3(__NR_write, 2, msg + off, msglen - off);
		if (w == -EINTR)
			continue;
		if (w <= 0)
			break;
		off += (unsigned long)w;
	}
	for (;;)
		sys1(__NR_exit_group, SHIM_FAILURE_EXIT);
}

/* failed starts the message: "sandbox: cannot start command: " + what. */
static void failed(const char *what) {
	msglen = 0;
	put("sandbox: cannot start command: ");
	put(what);
}

/* die_errno ends the message with ": " and errno e, and dies. */
__attribute__((noreturn)) static void die_errno(long e) {
	put(": ");
	puterr(e);
	die();
}

/* ------------------------------------------------------------------------
 * PATH lookup, as Go's exec.LookPath.
 */

/* executable is Go's findExecutable: 0 when path is a non-directory the
 * caller may execute, else -errno. */
static long executable(const char *path) {
	struct stat st; /* the architecture's own layout, from <asm/stat.h> */
	long r = sys4(__NR_newfstatat, AT_FDCWD, path, &st, 0);
	if (r < 0)
		return r;
	if ((st.st_mode & S_IFMT) == S_IFDIR)
		return -EISDIR;
	r = sys4(__NR_faccessat2, AT_FDCWD, path, X_OK, AT_EACCESS);
	if (r == 0 || (r != -ENOSYS && r != -EPERM))
		return r;
	return (st.st_mode & 0111) ? 0 : -EACCES;
}

/* lookpath resolves file on $PATH into buf: an empty entry means ".", and
 * a match found relative to the current directory is refused, not run. */
static void lookpath(const char *file, char **envp, char *buf, unsigned long size) {
	const char *path = 0;
	for (char **e = envp; *e; e++)
		if ((*e)[0] == 'P' && (*e)[1] == 'A' && (*e)[2] == 'T' && (*e)[3] == 'H' && (*e)[4] == '=') {
			path = *e + 5; /* the first one, as Go's os.Getenv */
			break;
		}
	unsigned long flen = slen(file);
	/* An unset or empty PATH has no entries (Go's filepath.SplitList). */
	for (const char *p = path; p && *path;) {
		const char *end = p;
		while (*end && *end != ':')
			end++;
		const char *dir = p;
		unsigned long dlen = (unsigned long)(end - p);
		if (dlen == 0)
			dir = ".", dlen = 1;
		if (dlen + 1 + flen < size) {
			memcpy(buf, dir, dlen);
			buf[dlen] = '/';
			memcpy(buf + dlen + 1, file, flen + 1);
			if (executable(buf) == 0) {
				if (buf[0] == '/')
					return;
				failed("exec: \"");
				put(file);
				put("\": cannot run executable found relative to current directory");
				die();
			}
		}
		if (*end == '\0')
			break;
		p = end + 1;
	}
	failed("exec: \"");
	put(file);
	put("\": executable file not found in $PATH");
	die();
}

/* ------------------------------------------------------------------------
 * Descriptors and hardening.
 */

struct dirent64 {
	__u64 ino;
	__s64 off;
	unsigned short reclen;
	unsigned char type;
	char name[];
};

/* cloexec_from sets FD_CLOEXEC on every descriptor >= first. */
static void cloexec_from(int first) {
	long r = sys3(__NR_close_range, first, ~0U, CLOSE_RANGE_CLOEXEC);
	if (r == 0)
		return;
	if (r != -ENOSYS && r != -EINVAL) {
		failed("close-on-exec: close_range");
		die_errno(-r);
	}
	/* Kernels before 5.11: walk /proc/self/fd. */
	long d = sys4(__NR_openat, AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (d < 0) {
		failed("close-on-exec: open /proc/self/fd");
		die_errno(-d);
	}
	char buf[4096] __attribute__((aligned(8)));
	for (;;) {
		long n = sys3(__NR_getdents64, d, buf, sizeof buf);
		if (n < 0) {
			failed("close-on-exec: read /proc/self/fd");
			die_errno(-n);
		}
		if (n == 0)
			break;
		for (long off = 0; off < n;) {
			struct dirent64 *e = (struct dirent64 *)(buf + off);
			off += e->reclen;
			long fd = 0;
			const char *c = e->name;
			if (*c == '\0')
				continue;
			for (; *c >= '0' && *c <= '9' && fd < (1L << 31); c++)
				fd = fd * 10 + (*c - '0');
			if (*c != '\0' || fd < first || fd == d)
				continue;
			long flags = sys2(__NR_fcntl, fd, F_GETFD);
			if (flags == -EBADF)
				continue;
			if (flags >= 0)
				flags = sys3(__NR_fcntl, fd, F_SETFD, flags | FD_CLOEXEC);
			if (flags < 0 && flags != -EBADF) {
				failed("close-on-exec: fd ");
				putd(fd);
				die_errno(-flags);
			}
		}
	}
	sys1(__NR_close, d);
}

/* cap_last_cap reads /proc/sys/kernel/cap_last_cap. */
static int cap_last_cap(void) {
	char buf[32];
	long fd = sys4(__NR_openat, AT_FDCWD, "/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0) {
		failed("hardening: open /proc/sys/kernel/cap_last_cap");
		die_errno(-fd);
	}
	long n = sys3(__NR_read, fd, buf, sizeof buf - 1);
	sys1(__NR_close, fd);
	if (n < 0) {
		failed("hardening: read /proc/sys/kernel/cap_last_cap");
		die_errno(-n);
	}
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		n--;
	buf[n] = '\0';
	long v = 0;
	int i = 0;
	for (; i < n && buf[i] >= '0' && buf[i] <= '9' && v <= 255; i++)
		v = v * 10 + (buf[i] - '0');
	if (n == 0 || i != n || v > 255) {
		failed("hardening: bad /proc/sys/kernel/cap_last_cap \"");
		put(buf);
		put("\"");
		die();
	}
	return (int)v;
}

static int kept(int cap) { return cap < 64 && (SHIM_KEPT_CAPS >> cap) & 1; }

/* verify re-reads the state harden set and dies if any of it is not so. */
static void verify(int last) {
	long v = prctl5(PR_GET_NO_NEW_PRIVS, 0);
	if (v != 1) {
		failed("hardening: no_new_privs not set (");
		putd(v);
		put(")");
		die();
	}
	v = prctl5(PR_GET_SECCOMP, 0);
	if (v != SECCOMP_MODE_FILTER) {
		failed("hardening: seccomp filter mode not active (");
		putd(v);
		put(")");
		die();
	}
	for (int c = 0; c <= last; c++) {
		v = prctl5(PR_CAPBSET_READ, c);
		if (v < 0) {
			failed("hardening: PR_CAPBSET_READ ");
			putd(c);
			die_errno(-v);
		}
		if ((v == 1) != kept(c)) {
			failed("hardening: capability ");
			putd(c);
			put(v == 1 ? " in bounding set: true, want false" : " in bounding set: false, want true");
			die();
		}
	}
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct data[2] = {{0, 0, 0}, {0, 0, 0}};
	v = sys2(__NR_capget, &hdr, data);
	if (v != 0) {
		failed("hardening: capget");
		die_errno(-v);
	}
	unsigned long long eff = data[0].effective | (unsigned long long)data[1].effective << 32;
	unsigned long long prm = data[0].permitted | (unsigned long long)data[1].permitted << 32;
	unsigned long long inh = data[0].inheritable | (unsigned long long)data[1].inheritable << 32;
	if (eff != SHIM_KEPT_CAPS || prm != SHIM_KEPT_CAPS || inh != SHIM_KEPT_CAPS) {
		failed("hardening: capabilities eff=");
		putx(eff);
		put(" prm=");
		putx(prm);
		put(" inh=");
		putx(inh);
		put(", want ");
		putx(SHIM_KEPT_CAPS);
		die();
	}
}

/*
 * harden applies §6.2 in the Go shim's order: no_new_privs; the bounding set
 * (dropping needs CAP_SETPCAP, so before capset); the ambient set (EINVAL:
 * a kernel before 4.3 has none); the seccomp filter, synchronised to every
 * thread (there is only this one); effective, permitted and inheritable
 * reduced to the kept mask. Then verify.
 */
static void harden(void) {
	int last = cap_last_cap();
	long r = prctl5(PR_SET_NO_NEW_PRIVS, 1);
	if (r != 0) {
		failed("hardening: PR_SET_NO_NEW_PRIVS");
		die_errno(-r);
	}
	for (int c = 0; c <= last; c++) {
		if (kept(c))
			continue;
		r = prctl5(PR_CAPBSET_DROP, c);
		if (r != 0) {
			failed("hardening: PR_CAPBSET_DROP ");
			putd(c);
			die_errno(-r);
		}
	}
	r = prctl5(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL);
	if (r != 0 && r != -EINVAL) {
		failed("hardening: PR_CAP_AMBIENT_CLEAR_ALL");
		die_errno(-r);
	}
	struct sock_fprog prog = {
	    .len = (unsigned short)(sizeof shim_seccomp_filter / sizeof shim_seccomp_filter[0]),
	    .filter = (struct sock_filter *)shim_seccomp_filter,
	};
	r = sys3(__NR_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
	if (r < 0) {
		failed("hardening: seccomp(SECCOMP_SET_MODE_FILTER)");
		die_errno(-r);
	}
	if (r != 0) { /* TSYNC reports the ID of a thread it could not synchronise */
		failed("hardening: seccomp: thread ");
		putd(r);
		put(" could not be synchronised");
		die();
	}
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct data[2] = {
	    {.effective = (__u32)SHIM_KEPT_CAPS, .permitted = (__u32)SHIM_KEPT_CAPS, .inheritable = (__u32)SHIM_KEPT_CAPS},
	    {.effective = (__u32)(SHIM_KEPT_CAPS >> 32),
	     .permitted = (__u32)(SHIM_KEPT_CAPS >> 32),
	     .inheritable = (__u32)(SHIM_KEPT_CAPS >> 32)},
	};
	r = sys2(__NR_capset, &hdr, data);
	if (r != 0) {
		failed("hardening: capset");
		die_errno(-r);
	}
	verify(last);
}

void shim_main(long *sp) {
	int argc = (int)sp[0];
	char **argv = (char **)(sp + 1);
	char **envp = argv + argc + 1;
	static char found[PATH_MAX];

	char **args = argv + 1;
	int n = argc - 1;
	const char *dir = 0;
	const char *nproc = 0;
	/* -C DIR: change to DIR first. The FUSE holder starts commands in "/"
	 * and has the shim enter /workspace, which that holder serves itself.
	 * -P NPROC: RLIMIT_NPROC, before anything can fork. */
	for (;;) {
		if (n >= 2 && seq(args[0], "-C")) {
			dir = args[1];
			args += 2, n -= 2;
		} else if (n >= 2 && seq(args[0], "-P")) {
			nproc = args[1];
			args += 2, n -= 2;
		} else {
			break;
		}
	}
	if (n < 2 || !seq(args[0], "--") || args[1][0] == '\0') {
		failed("usage: sandbox-exec-shim [-C DIR] [-P NPROC] -- ARGV...");
		die();
	}
	if (nproc) {
		struct {
			unsigned long long cur, max;
		} rl = {0, 0};
		const char *p = nproc;
		for (; *p >= '0' && *p <= '9'; p++)
			rl.cur = rl.cur * 10 + (unsigned long long)(*p - '0');
		if (*p != '\0' || p == nproc || rl.cur == 0) {
			failed("-P: not a positive number: ");
			put(nproc);
			die();
		}
		rl.max = rl.cur;
		long r = sys4(__NR_prlimit64, 0, 6 /* RLIMIT_NPROC */, &rl, 0);
		if (r != 0) {
			failed("setrlimit RLIMIT_NPROC");
			die_errno(-r);
		}
	}
	if (dir && dir[0]) {
		long r = sys1(__NR_chdir, dir);
		if (r != 0) {
			failed("chdir ");
			put(dir);
			die_errno(-r);
		}
	}
	char **cmd = args + 1;
	const char *path = cmd[0];
	const char *s = path;
	while (*s && *s != '/')
		s++;
	if (*s == '\0') {
		lookpath(path, envp, found, sizeof found);
		path = found;
	}
	cloexec_from(3);
	harden();
	long r = sys3(__NR_execve, path, cmd, envp);
	failed("exec ");
	put(path);
	die_errno(-r);
}
