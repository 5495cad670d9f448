// SPDX-License-Identifier: MIT
/*
 * Stopping the other threads of this process for a moment (issue 18).
 *
 * Backing a registered range copies private pages into the identity memfd
 * and maps the memfd over them (backing.c).  A store another thread makes
 * between the copy and the mapping would be lost, so no other thread may
 * run then: urdma_stop_world() stops every other thread of the process,
 * runs the function, and lets them go.
 *
 * How: a real-time signal of our own (the highest one the application
 * leaves at its default), sent with tgkill to each thread listed in
 * /proc/self/task that is running or runnable; its handler counts itself
 * in and sleeps on a futex until the generation moves on.  A thread asleep
 * (in poll, read, futex, sigwait...) can't store anything while it sleeps:
 * it is not signalled, so its system call neither returns EINTR nor
 * restarts (programs such as rping treat an EINTR from rdma_get_cm_event as
 * fatal), and its run time (schedstat) is noted.  The list is read again
 * until a pass finds no new thread, none running, and no sleeper that ran
 * meanwhile; a thread in clone() with our signal pending restarts the
 * call, so none escapes.  Nothing here allocates or locks once the first
 * signal is sent: a stopped thread may hold malloc's lock.
 *
 * A thread listed as runnable that goes to sleep before the signal comes
 * takes it in its system call all the same: a poll() or a futex wait then
 * returns EINTR (SA_RESTART restarts only read(), write() and their
 * kind).  The library's own waits for the application (rdma_get_cm_event,
 * ibv_get_cq_event) wait again when a stop came meanwhile
 * (urdma_stop_seq); the application's own are exposed for that moment.
 *
 * The one gap: a sleeper that wakes while fn runs (its I/O completes, a
 * timer fires) runs unstopped.  fn asks urdma_stop_intact() before the
 * step that would lose such a thread's stores (backing.c: before mapping
 * the copy) and gives up if one ran; one that wakes after that question
 * still shows afterwards, and a warning names it.
 * A thread that blocks our signal (a sigwait() thread, a thread being
 * born) is waited for until it sleeps.  One thread alone (the process has
 * no other): only its own signals are blocked while fn runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "core/urdma.h"
#include "util/log.h"

#define MAX_TIDS 4096
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define STOP_WAIT_NS 1000000000ull /* for all the threads to stop */

static pthread_mutex_t stop_lock = PTHREAD_MUTEX_INITIALIZER;
static int stop_sig;
/* Odd while a stop is on; the handler sleeps until it changes. */
static _Atomic uint32_t stop_gen;
/* The threads stopped: the stop's generation (low 16 bits) << 16 | count,
 * so that a handler late for an earlier stop counts for none. */
static _Atomic uint32_t stop_acks;
#define ACK_GEN(g) (((g) & 0xffffu) << 16)
#define ACK_COUNT(v) ((v) & 0xffffu)
/* Threads signalled in this stop (stop_lock), allocated once. */
static pid_t *tids;

static long futex(_Atomic uint32_t *w, int op, uint32_t v,
		  const struct timespec *ts)
{
	return syscall(SYS_futex, w, op, v, ts, NULL, 0);
}

static void stop_handler(int sig, siginfo_t *si, void *uc)
{
	int saved = errno;
	uint32_t gen = atomic_load(&stop_gen);

	(void)sig;
	(void)uc;
	/* Ours only: from this process (tgkill), while a stop is on. */
	if (si->si_code != SI_TKILL || si->si_pid != getpid() || !(gen & 1)) {
		errno = saved;
		return;
	}
	for (uint32_t v = atomic_load(&stop_acks);;) {
		if ((v & ~0xffffu) != ACK_GEN(gen))
			break; /* a later stop: its own signal is coming */
		if (atomic_compare_exchange_weak(&stop_acks, &v, v + 1)) {
			futex(&stop_acks, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
			break;
		}
	}
	while (atomic_load(&stop_gen) == gen)
		futex(&stop_gen, FUTEX_WAIT_PRIVATE, gen, NULL);
	errno = saved;
}

/* Our signal: installed on the highest real-time signal the application
 * leaves at its default; again elsewhere if the application took it. */
static int stop_signal(void)
{
	struct sigaction cur, sa = { .sa_sigaction = stop_handler,
				     .sa_flags = SA_SIGINFO | SA_RESTART };

	if (stop_sig && !sigaction(stop_sig, NULL, &cur) &&
	    (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == stop_handler)
		return stop_sig;
	sigfillset(&sa.sa_mask);
	for (int s = SIGRTMAX; s >= SIGRTMIN + 4; s--) {
		if (s == stop_sig || sigaction(s, NULL, &cur) ||
		    (cur.sa_flags & SA_SIGINFO) || cur.sa_handler != SIG_DFL)
			continue;
		if (sigaction(s, &sa, NULL))
			continue;
		if (stop_sig)
			urdma_info("signal %d was taken over: stopping threads "
				   "with %d now", stop_sig, s);
		stop_sig = s;
		return s;
	}
	return -EAGAIN;
}

/* The threads of this process: tids[] (without us), from /proc, without
 * allocating.  Returns how many, -errno, or -E2BIG. */
static int list_tasks(int dirfd, pid_t self, pid_t *out, int max)
{
	char buf[4096];
	int n = 0;
	long k;

	if (lseek(dirfd, 0, SEEK_SET) < 0)
		return -errno;
	while ((k = syscall(SYS_getdents64, dirfd, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < k;) {
			struct {
				uint64_t ino;
				int64_t off;
				unsigned short reclen;
				unsigned char type;
				char name[];
			} *d = (void *)(buf + off);
			pid_t tid = 0;

			off += d->reclen;
			for (const char *c = d->name; *c >= '0' && *c <= '9'; c++)
				tid = tid * 10 + (*c - '0');
			if (!tid || tid == self)
				continue;
			if (n == max)
				return -E2BIG;
			out[n++] = tid;
		}
	}
	return k < 0 ? -errno : n;
}

/* /proc/self/task/<tid>/<what>, NUL-terminated in buf: its length, or
 * -1 (the thread is gone, or soon). */
static ssize_t task_read(pid_t tid, const char *what, char *buf, size_t len)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/self/task/%d/%s", (int)tid, what);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	return n;
}

/* Does thread tid block signal sig?  (SigBlk in its status.) */
static bool task_blocks(pid_t tid, int sig)
{
	char buf[2048];
	uint64_t mask = 0;
	const char *p;

	if (task_read(tid, "status", buf, sizeof(buf)) < 0)
		return false;
	p = strstr(buf, "\nSigBlk:");
	if (!p)
		return false;
	for (p += 8; *p == '\t' || *p == ' '; p++)
		;
	for (; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); p++)
		mask = mask << 4 | (uint64_t)(*p <= '9' ? *p - '0' : *p - 'a' + 10);
	return mask >> (sig - 1) & 1;
}

/* How long thread tid has run (ns, from schedstat), and whether it is
 * running or runnable now.  -1 when it can't be read (it is gone). */
static int64_t task_runtime(pid_t tid, bool *runnable)
{
	char buf[512];
	const char *p;
	int64_t t = 0;

	if (task_read(tid, "stat", buf, sizeof(buf)) < 0)
		return -1;
	p = strrchr(buf, ')'); /* the name may hold anything */
	*runnable = !p || p[1] != ' ' || p[2] == 'R';
	if (task_read(tid, "schedstat", buf, sizeof(buf)) < 0)
		return -1;
	for (p = buf; *p >= '0' && *p <= '9'; p++)
		t = t * 10 + (*p - '0');
	return t;
}

static bool signalled(pid_t tid, int n)
{
	for (int i = 0; i < n; i++)
		if (tids[i] == tid)
			return true;
	return false;
}

static const char *task_name(pid_t tid, char *buf, size_t len)
{
	ssize_t n = task_read(tid, "comm", buf, len);

	if (n <= 0)
		n = 1, buf[0] = '?';
	if (buf[n - 1] == '\n')
		n--;
	buf[n] = 0;
	return buf;
}

/* Threads left asleep, and how long each had run (stop_lock). */
static struct {
	pid_t tid;
	int64_t ran;
} *held;
static int nheld;

static int held_index(pid_t tid)
{
	for (int i = 0; i < nheld; i++)
		if (held[i].tid == tid)
			return i;
	return -1;
}

/*
 * Stop every other thread that runs; leave the sleeping ones asleep.  A
 * pass over /proc/self/task signals each thread that is running or
 * runnable, and notes how long each sleeping one has run; passes repeat
 * until all signalled threads are stopped and a pass finds no thread new,
 * none running and no sleeper that ran since the pass before.  A thread
 * that runs but blocks our signal is waited for.  Under stop_lock, our
 * signals blocked.  0, -ETIMEDOUT (a thread did not stop in time) or
 * -EBUSY (held[*late] runs and blocks our signal): the ones stopped are
 * let go by the caller.
 */
static int stop_all(int dirfd, int sig, pid_t self, int *nsig, int *late)
{
	static pid_t now[MAX_TIDS];
	uint64_t end = urdma_now_ns() + STOP_WAIT_NS;
	int n = 0;

	nheld = 0;
	for (;;) {
		int k = list_tasks(dirfd, self, now, MAX_TIDS);
		bool moved = false;

		if (k < 0)
			return k == -E2BIG ? -EAGAIN : k;
		for (int i = 0; i < k; i++) {
			int h = held_index(now[i]);
			bool busy = true;
			int64_t ran;

			if (signalled(now[i], n))
				continue;
			ran = task_runtime(now[i], &busy);
			if (ran < 0)
				continue; /* gone */
			if (!busy) {
				if (h < 0) {
					if (nheld == MAX_TIDS)
						return -EAGAIN;
					h = nheld++;
					held[h].tid = now[i];
					moved = true;
				} else if (held[h].ran != ran) {
					moved = true;
				}
				held[h].ran = ran;
				continue;
			}
			moved = true;
			if (task_blocks(now[i], sig)) {
				/* Being born (signals blocked until it
				 * starts), or it blocks ours: wait. */
				if (h < 0) {
					if (nheld == MAX_TIDS)
						return -EAGAIN;
					h = nheld++;
					held[h].tid = now[i];
				}
				if (urdma_now_ns() > end) {
					*late = h;
					return -EBUSY;
				}
				held[h].ran = -1;
				continue;
			}
			if (h >= 0) /* it woke: stop it */
				held[h] = held[--nheld];
			if (n == MAX_TIDS)
				return -EAGAIN; /* threads come and go too fast */
			if (syscall(SYS_tgkill, getpid(), now[i], sig))
				continue; /* gone already */
			tids[n++] = now[i];
		}
		*nsig = n;
		/* Wait for the acks; a thread that exits before taking the
		 * signal never acks: count those still listed. */
		for (;;) {
			uint32_t a = atomic_load(&stop_acks);
			struct timespec ts = { 0, 2000000 };
			int alive = 0;

			if (ACK_COUNT(a) >= (uint32_t)n)
				break;
			if (urdma_now_ns() > end) {
				*late = (int)ACK_COUNT(a);
				return -ETIMEDOUT;
			}
			futex(&stop_acks, FUTEX_WAIT_PRIVATE, a, &ts);
			k = list_tasks(dirfd, self, now, MAX_TIDS);
			for (int i = 0; i < k; i++)
				alive += signalled(now[i], n);
			if (k >= 0 &&
			    ACK_COUNT(atomic_load(&stop_acks)) >= (uint32_t)alive &&
			    alive < n)
				break; /* the rest exited */
		}
		if (!moved)
			return 0;
		if (urdma_now_ns() > end) {
			*late = -1;
			return -ETIMEDOUT;
		}
		sched_yield();
	}
}

/* The library's own threads: woken while a stop is on, they wait at
 * urdma_stop_point() before touching any memory but their stacks. */
static _Atomic pid_t coop[8];

void urdma_stop_coop(void)
{
	pid_t self = (pid_t)syscall(SYS_gettid);

	for (unsigned int i = 0; i < ARRAY_SIZE(coop); i++) {
		pid_t none = 0;

		if (atomic_compare_exchange_strong(&coop[i], &none, self))
			return;
	}
}

static bool is_coop(pid_t tid)
{
	for (unsigned int i = 0; i < ARRAY_SIZE(coop); i++)
		if (atomic_load(&coop[i]) == tid)
			return true;
	return false;
}

void urdma_stop_point(void)
{
	uint32_t gen;

	while ((gen = atomic_load(&stop_gen)) & 1)
		futex(&stop_gen, FUTEX_WAIT_PRIVATE, gen, NULL);
}

uint32_t urdma_stop_seq(void)
{
	return atomic_load(&stop_gen);
}

/* Did a thread left asleep run while fn ran?  Its tid, or 0. */
static pid_t held_ran(void)
{
	for (int i = 0; i < nheld; i++) {
		bool busy;
		int64_t t = task_runtime(held[i].tid, &busy);

		if (is_coop(held[i].tid))
			continue;
		if (t >= 0 && (t != held[i].ran || busy))
			return held[i].tid;
	}
	return 0;
}

bool urdma_stop_intact(void)
{
	return !held_ran();
}

/*
 * fn runs on a stack of its own, not the caller's.  The pages fn moves
 * may be this thread's own stack (a buffer there: rdma_reg_msgs of a
 * local array), and the frames fn and what it calls push below that
 * buffer may lie in the same page: a store there between the page's copy
 * and its mapping would be lost, return addresses among them (a return to
 * address 0).  On job_stack the caller's stack is left alone from the
 * switch, before any copy, to the return.  The stack is the stop's
 * (stop_lock); signals are blocked meanwhile.
 */
#define JOB_STACK_SIZE (256 * 1024) /* ASan's frames are larger */
static void *job_stack;

#if defined(__x86_64__)
/* A call on another stack: rsp kept in rbx (callee-saved), the stack's
 * top 16-byte aligned before the call, as the ABI wants.  (Not
 * swapcontext: ASan warns of false positives with it.) */
static int run_on_job_stack(int (*fn)(void *), void *arg)
{
	void *top = (char *)job_stack + JOB_STACK_SIZE;
	register void *a __asm__("rdi") = arg;
	int ret;

	__asm__ volatile("mov %%rsp, %%rbx\n\t"
			 "mov %[top], %%rsp\n\t"
			 "call *%[fn]\n\t"
			 "mov %%rbx, %%rsp"
			 : "=a"(ret), "+r"(a)
			 : [top] "r"(top), [fn] "r"(fn)
			 : "rbx", "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11",
			   "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",
			   "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
			   "xmm13", "xmm14", "xmm15", "memory", "cc");
	return ret;
}
#else
static ucontext_t job_ctx, job_caller;
static int (*job_fn)(void *);
static void *job_arg;
static int job_ret;

static void job_entry(void)
{
	job_ret = job_fn(job_arg);
	/* (uc_link: back to job_caller) */
}

static int run_on_job_stack(int (*fn)(void *), void *arg)
{
	job_fn = fn;
	job_arg = arg;
	if (getcontext(&job_ctx))
		return -errno;
	job_ctx.uc_stack.ss_sp = job_stack;
	job_ctx.uc_stack.ss_size = JOB_STACK_SIZE;
	job_ctx.uc_link = &job_caller;
	makecontext(&job_ctx, job_entry, 0);
	if (swapcontext(&job_caller, &job_ctx))
		return -errno;
	return job_ret;
}
#endif

int urdma_stop_world(int (*fn)(void *), void *arg)
{
	sigset_t all, old;
	pid_t self = (pid_t)syscall(SYS_gettid), ran = 0;
	int sig, ret, nsig = 0, late = 0, dirfd;
	char name[32];

	pthread_mutex_lock(&stop_lock);
	if (!tids) { /* the job's stack first: it grows down, off the map */
		char *m = mmap(NULL, JOB_STACK_SIZE + MAX_TIDS * (sizeof(*tids) +
								 sizeof(*held)),
			       PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);

		if (m == MAP_FAILED) {
			pthread_mutex_unlock(&stop_lock);
			return -ENOMEM;
		}
		job_stack = m;
		held = (void *)(m + JOB_STACK_SIZE);
		tids = (pid_t *)(held + MAX_TIDS);
	}
	dirfd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	sig = stop_signal();
	if (dirfd < 0 || sig < 0) {
		ret = dirfd < 0 ? -errno : sig;
		goto out_unlock;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	/* The acks of the next generation from 0, then odd: stopping. */
	atomic_store(&stop_acks, ACK_GEN(atomic_load(&stop_gen) + 1));
	atomic_fetch_add(&stop_gen, 1);
	ret = stop_all(dirfd, sig, self, &nsig, &late);
	if (!ret) {
		ret = run_on_job_stack(fn, arg);
		if (!ret) /* fn did its work: did a sleeper wake meanwhile? */
			ran = held_ran();
	}
	atomic_fetch_add(&stop_gen, 1); /* even: go */
	futex(&stop_gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret == -ETIMEDOUT && late >= 0)
		urdma_warn("%d of %d threads stopped within %llu ms (signal %d)",
			   late, nsig, STOP_WAIT_NS / 1000000, sig);
	else if (ret == -ETIMEDOUT)
		urdma_warn("threads kept waking for %llu ms: they can't be "
			   "stopped", STOP_WAIT_NS / 1000000);
	if (ret == -EBUSY)
		urdma_warn("thread %d (%s) blocks signal %d and did not sleep "
			   "within %llu ms", (int)held[late].tid,
			   task_name(held[late].tid, name, sizeof(name)), sig,
			   STOP_WAIT_NS / 1000000);
	if (ran)
		urdma_warn("thread %d (%s) woke while pages were moved into "
			   "shared memory: a store it made to them meanwhile "
			   "may be lost", (int)ran,
			   task_name(ran, name, sizeof(name)));
	if (ret == -ETIMEDOUT || ret == -EBUSY)
		ret = -EAGAIN;
out_unlock:
	if (dirfd >= 0)
		close(dirfd);
	pthread_mutex_unlock(&stop_lock);
	return ret;
}

/* A forked child is alone, and holds no stop. */
static void stop_atfork_child(void)
{
	for (unsigned int i = 0; i < ARRAY_SIZE(coop); i++)
		atomic_store(&coop[i], 0);
	pthread_mutex_init(&stop_lock, NULL);
	atomic_store(&stop_gen, 0);
}

__attribute__((constructor)) static void stop_init(void)
{
	pthread_atfork(NULL, NULL, stop_atfork_child);
}
