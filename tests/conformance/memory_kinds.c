/* SPDX-License-Identifier: MIT */
/*
 * Conformance: every kind of memory a program registers works, on both
 * sides of every operation, over shared memory and over TCP.
 *
 * Kinds: shared anonymous memory (also shared with a forked child, which
 * must see what RDMA wrote), a shared mapping of a tmpfs file and of a
 * file on disk, SysV shared memory, hugetlb pages (anonymous and SysV
 * SHM_HUGETLB, as perftest --use_hugepages; skipped where the system has
 * none and can't lend some), and the private heap as the control.
 *
 * Each case: the parent (initiator) and the child (target) both take their
 * buffers from the kind; a shared kind is also mapped a second time, and
 * the target checks that what RDMA wrote is in the object (seen through
 * that second mapping), not only in its own mapping.  The parent WRITEs into the child's region, READs
 * a pattern the child wrote, SENDs into a receive the child posted there,
 * runs fetch-and-adds and compare-and-swaps on a word of it, and the child
 * checks every byte and the counter.  Also: memory that can't be written
 * can't be registered for writing.
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN (4u << 20) /* two huge pages */
#define HALF (LEN / 2)
#define SEND_AT (HALF - 8192)
#define SEND_LEN 3000u
#define CTR_AT (HALF - 64)
#define NATOMIC 200

enum kind {
	K_HEAP,
	K_SHARED_ANON,
	K_TMPFS_FILE,
	K_DISK_FILE,
	K_SYSV,
	K_HUGE_ANON,
	K_HUGE_SYSV,
	K_COUNT
};

static const char *const kind_name[] = { "heap", "shared_anon", "tmpfs_file",
					 "disk_file", "sysv", "huge_anon",
					 "huge_sysv" };

/* The memory of kind k, LEN bytes, zeroed; NULL (and why) if this system
 * has none of it.  *view: a second mapping of the same object (NULL for
 * private kinds). */
static void *kind_alloc(enum kind k, const char **why, void **view)
{
	char path[64];
	void *p = MAP_FAILED;
	int fd, id;

	*view = NULL;
	switch (k) {
	case K_HEAP:
		return t_alloc(LEN);
	case K_SHARED_ANON:
		p = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		/* old_size 0: the same shared pages once more */
		if (p != MAP_FAILED)
			*view = mremap(p, 0, LEN, MREMAP_MAYMOVE);
		break;
	case K_TMPFS_FILE:
	case K_DISK_FILE:
		snprintf(path, sizeof(path), "%s/urdma-kinds-XXXXXX",
			 k == K_TMPFS_FILE ? "/dev/shm" : ".");
		fd = mkstemp(path);
		REQUIRE(fd >= 0, "mkstemp %s: %s", path, strerror(errno));
		unlink(path);
		REQUIRE(ftruncate(fd, LEN) == 0, "ftruncate");
		p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		*view = mmap(NULL, LEN, PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		break;
	case K_SYSV:
	case K_HUGE_SYSV:
		id = shmget(IPC_PRIVATE, LEN,
			    IPC_CREAT | 0600 | (k == K_HUGE_SYSV ? SHM_HUGETLB : 0));
		if (id < 0) {
			*why = strerror(errno);
			return NULL;
		}
		p = shmat(id, NULL, 0);
		*view = shmat(id, NULL, SHM_RDONLY);
		shmctl(id, IPC_RMID, NULL); /* gone with the last detach */
		if (p == (void *)-1)
			p = MAP_FAILED;
		break;
	case K_HUGE_ANON:
		p = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
		break;
	default:
		break;
	}
	if (p == MAP_FAILED) {
		*why = strerror(errno);
		return NULL;
	}
	REQUIRE(k == K_HUGE_ANON || (*view && *view != MAP_FAILED &&
				     *view != (void *)-1),
		"a second mapping of the %s memory: %s", kind_name[k],
		strerror(errno));
	return p;
}

static void kind_unmap(enum kind k, void *p)
{
	if (k == K_SYSV || k == K_HUGE_SYSV)
		shmdt(p);
	else
		munmap(p, LEN);
}

static void kind_free(enum kind k, void *p, void *view)
{
	if (k == K_HEAP)
		free(p);
	else
		kind_unmap(k, p);
	if (view)
		kind_unmap(k, view);
}

static void *kind_get(enum kind k, void **view)
{
	const char *why = "";
	void *p = kind_alloc(k, &why, view);

	if (!p)
		t_skip("no %s memory here: %s", kind_name[k], why);
	return p;
}

struct param {
	enum kind kind;
	const char *transport;
};

static unsigned int all_access(void)
{
	return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
	       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
}

/* The target: its region from the kind; [HALF, LEN) holds a pattern to
 * be read, a receive is posted at SEND_AT, the counter is at CTR_AT. */
static void target_side(struct t_peer *peer, void *arg)
{
	struct param *pa = arg;
	unsigned char *m, *view;
	struct t_res r;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	pid_t sharer = -1;
	int status = 0;
	uint64_t ctr;

	setenv("URDMA_TRANSPORT", pa->transport, 1);
	m = kind_get(pa->kind, (void **)&view);
	t_pattern_fill(m + HALF, HALF, 7);
	if (pa->kind == K_SHARED_ANON) {
		/* Memory shared with a forked child: it sees what RDMA
		 * writes (checked after the operations). */
		sharer = fork();
		if (sharer == 0) {
			for (int i = 0; i < 1000 && m[HALF - 1] != 0x5a; i++)
				usleep(10000);
			_exit(t_pattern_check(m, SEND_AT, 3) == -1 ? 0 : 1);
		}
		REQUIRE(sharer > 0, "fork");
	}
	t_res_open(&r, NULL);
	mr = t_reg(&r, m, LEN, all_access());
	t_connect_pair(peer, &r, mr, NULL);
	/* Before the parent's SEND, which comes after a WRITE and a READ (an
	 * early one would only wait for it: RNR retries). */
	REQUIRE(t_post_recv(r.qp, 9, m + SEND_AT, SEND_LEN, mr->lkey) == 0,
		"post_recv");
	t_barrier(peer); /* the parent works */
	CHECK(t_expect_wc(r.recv_cq, &wc, 9, IBV_WC_SUCCESS, IBV_WC_RECV,
			  "the SEND's receive"),
	      "receive");
	CHECK(wc.byte_len == SEND_LEN, "byte_len %u", wc.byte_len);
	CHECK(t_pattern_check(m, SEND_AT, 3) == -1,
	      "the WRITE's bytes, first bad at %ld", t_pattern_check(m, SEND_AT, 3));
	CHECK(t_pattern_check(m + SEND_AT, SEND_LEN, 5) == -1,
	      "the SEND's bytes");
	memcpy(&ctr, m + CTR_AT, 8);
	CHECK(ctr == 1000 + NATOMIC * 3, "counter %llu, expected %u",
	      (unsigned long long)ctr, 1000 + NATOMIC * 3);
	CHECK(t_pattern_check(m + HALF, HALF, 7) == -1, "READ left the source alone");
	if (view)
		CHECK(t_pattern_check(view, SEND_AT, 3) == -1 &&
			      t_pattern_check(view + SEND_AT, SEND_LEN, 5) == -1,
		      "the WRITE's and the SEND's bytes are in the %s object, "
		      "as its second mapping shows", kind_name[pa->kind]);
	if (sharer > 0) {
		m[HALF - 1] = 0x5a;
		CHECK(waitpid(sharer, &status, 0) == sharer && WIFEXITED(status) &&
			      WEXITSTATUS(status) == 0,
		      "the forked sharer saw the WRITE's bytes");
	}
	t_barrier(peer);
	t_res_close(&r);
	kind_free(pa->kind, m, view);
}

static void initiator_side(struct t_peer *peer, void *arg)
{
	struct param *pa = arg;
	struct t_conn remote;
	struct ibv_wc wc;
	unsigned char *m;
	void *view;
	struct ibv_mr *mr;
	struct t_res r;
	uint64_t t0 = t_now_us();

	setenv("URDMA_TRANSPORT", pa->transport, 1);
	m = kind_get(pa->kind, &view);
	t_res_open(&r, NULL);
	mr = t_reg(&r, m, LEN, all_access());
	t_connect_pair(peer, &r, mr, &remote);

	/* WRITE [0, SEND_AT) of the target from [0, SEND_AT) here. */
	t_pattern_fill(m, SEND_AT, 3);
	REQUIRE(t_post_send(r.qp, 1, IBV_WR_RDMA_WRITE, m, SEND_AT, mr->lkey,
			    IBV_SEND_SIGNALED, remote.addr, remote.rkey) == 0,
		"post WRITE");
	CHECK(t_expect_wc(r.send_cq, &wc, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
			  "WRITE"),
	      "write");
	/* READ the target's [HALF, LEN) into [HALF, LEN) here. */
	memset(m + HALF, 0, HALF);
	REQUIRE(t_post_send(r.qp, 2, IBV_WR_RDMA_READ, m + HALF, HALF, mr->lkey,
			    IBV_SEND_SIGNALED, remote.addr + HALF,
			    remote.rkey) == 0,
		"post READ");
	CHECK(t_expect_wc(r.send_cq, &wc, 2, IBV_WC_SUCCESS, IBV_WC_RDMA_READ,
			  "READ"),
	      "read");
	CHECK(t_pattern_check(m + HALF, HALF, 7) == -1, "the READ's bytes, first bad at %ld",
	      t_pattern_check(m + HALF, HALF, 7));
	/* SEND into the target's receive. */
	t_pattern_fill(m + SEND_AT, SEND_LEN, 5);
	REQUIRE(t_post_send(r.qp, 3, IBV_WR_SEND, m + SEND_AT, SEND_LEN,
			    mr->lkey, IBV_SEND_SIGNALED, 0, 0) == 0,
		"post SEND");
	CHECK(t_expect_wc(r.send_cq, &wc, 3, IBV_WC_SUCCESS, IBV_WC_SEND, "SEND"),
	      "send");
	/* The counter: a CAS from 0 to 1000, then fetch-and-adds of 3, each
	 * result landing in this side's memory of the kind. */
	uint64_t *res = (uint64_t *)(m + CTR_AT);

	*res = 77;
	REQUIRE(t_post_atomic(r.qp, 4, IBV_WR_ATOMIC_CMP_AND_SWP, res, mr->lkey,
			      remote.addr + CTR_AT, remote.rkey, 0, 1000) == 0,
		"post CAS");
	CHECK(t_expect_wc(r.send_cq, &wc, 4, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, "CAS"),
	      "cas");
	CHECK(*res == 0, "CAS returned %llu", (unsigned long long)*res);
	for (int i = 0; i < NATOMIC; i++) {
		REQUIRE(t_post_atomic(r.qp, 100 + i, IBV_WR_ATOMIC_FETCH_AND_ADD,
				      res, mr->lkey, remote.addr + CTR_AT,
				      remote.rkey, 3, 0) == 0,
			"post FAA");
		if (!t_expect_wc(r.send_cq, &wc, 100 + i, IBV_WC_SUCCESS,
				 IBV_WC_FETCH_ADD, "FAA"))
			break;
		if (!CHECK(*res == 1000 + 3u * i, "FAA %d returned %llu", i,
			   (unsigned long long)*res))
			break;
	}
	t_note("%s over %s: %llu us", kind_name[pa->kind], pa->transport,
	       (unsigned long long)(t_now_us() - t0));
	t_barrier(peer);
	t_barrier(peer);
	t_res_close(&r);
	kind_free(pa->kind, m, view);
}

/* Memory that can't be written can't be registered for writing, as with
 * a real device (the pages are pinned for writing); for reading it can. */
static void read_only_case(void *arg)
{
	struct t_res r;
	struct ibv_mr *mr;
	char *p = mmap(NULL, 8192, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	char *q = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	(void)arg;
	REQUIRE(p != MAP_FAILED && q != MAP_FAILED, "mmap");
	t_res_open(&r, NULL);
	for (int i = 0; i < 2; i++) {
		char *m = i ? q : p;

		errno = 0;
		mr = ibv_reg_mr(r.pd, m, 8192, IBV_ACCESS_LOCAL_WRITE);
		CHECK(!mr && errno == EFAULT, "%s read-only: %p errno %d",
		      i ? "private" : "shared", (void *)mr, errno);
		mr = ibv_reg_mr(r.pd, m, 8192, IBV_ACCESS_REMOTE_READ);
		CHECK(mr, "read-only memory for reading: errno %d", errno);
		if (mr)
			CHECK(ibv_dereg_mr(mr) == 0, "dereg");
	}
	t_res_close(&r);
	munmap(p, 8192);
	munmap(q, 8192);
}

/* Hugetlb pages for the huge cases: as root, let the kernel lend some
 * (surplus pages, returned when freed) if none are reserved; restored at
 * the end. */
static char overcommit_was[32];

static void huge_lend(void)
{
	const char *f = "/proc/sys/vm/nr_overcommit_hugepages";
	FILE *fp = fopen(f, "r");

	if (!fp)
		return;
	if (!fgets(overcommit_was, sizeof(overcommit_was), fp))
		overcommit_was[0] = 0;
	fclose(fp);
	if (geteuid() != 0 || atoi(overcommit_was) >= 8) {
		overcommit_was[0] = 0;
		return;
	}
	fp = fopen(f, "w");
	if (!fp || fprintf(fp, "8\n") < 0)
		overcommit_was[0] = 0;
	if (fp)
		fclose(fp);
}

static void huge_restore(void)
{
	FILE *fp;

	if (!overcommit_was[0])
		return;
	fp = fopen("/proc/sys/vm/nr_overcommit_hugepages", "w");
	if (fp) {
		fputs(overcommit_was, fp);
		fclose(fp);
	}
}

int main(int argc, char **argv)
{
	static const char *const transports[] = { "shm", "tcp" };
	static struct param params[K_COUNT * 2];
	static char names[K_COUNT * 2][64];
	int ret, n = 0;

	t_init(argc, argv);
	huge_lend();
	t_case("read_only_refused_for_writing", read_only_case, NULL);
	for (int k = 0; k < K_COUNT; k++) {
		for (int t = 0; t < 2; t++, n++) {
			params[n] = (struct param){ .kind = k,
						    .transport = transports[t] };
			snprintf(names[n], sizeof(names[n]), "%s_%s",
				 kind_name[k], transports[t]);
			t_pair(names[n], initiator_side, target_side, &params[n]);
		}
	}
	ret = t_finish();
	huge_restore();
	return ret;
}
