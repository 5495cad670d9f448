/* SPDX-License-Identifier: MIT */
/*
 * An MPI job that checks what it moves (built by the MPI test scripts
 * with Debian's mpicc): between ranks 0 and 1, a ping-pong of every size
 * from 1 byte to 4 MiB (powers of 4), each message's bytes changed by the
 * receiver and checked by the sender; an 8-byte ping-pong timed (the
 * one-way latency); 1 MiB messages timed (the bandwidth); then
 * MPI_Allreduce (MPI_SUM of longs) of 1 to 262,144 elements across all
 * ranks, every element checked.  Prints one line, "mpi_check: ok ..." or
 * "mpi_check: BAD ...", and exits 0 only if everything was right.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX (4 << 20)

static unsigned char pat(long i, int it, int sz, int plus)
{
	return (unsigned char)(i * 7 + it + sz + plus);
}

int main(int argc, char **argv)
{
	int rank, size, bad = 0, all_bad;
	unsigned char *buf;
	double lat = 0, bw = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	buf = malloc(MAX);
	if (!buf || size < 2)
		MPI_Abort(MPI_COMM_WORLD, 2);
	for (int sz = 1; sz <= MAX; sz *= 4) {
		for (int it = 0; it < 10; it++) {
			if (rank == 0) {
				for (long i = 0; i < sz; i++)
					buf[i] = pat(i, it, sz, 0);
				MPI_Send(buf, sz, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
				MPI_Recv(buf, sz, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (long i = 0; i < sz; i++)
					if (buf[i] != pat(i, it, sz, 1)) {
						bad++;
						break;
					}
			} else if (rank == 1) {
				MPI_Recv(buf, sz, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (long i = 0; i < sz; i++)
					buf[i]++;
				MPI_Send(buf, sz, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
			}
		}
	}
	/* 8 B one-way latency and 1 MiB bandwidth, ranks 0 and 1 */
	for (int pass = 0; pass < 2; pass++) {
		int n = pass ? 200 : 20000, sz = pass ? 1 << 20 : 8;
		double t0;

		MPI_Barrier(MPI_COMM_WORLD);
		t0 = MPI_Wtime();
		for (int i = 0; i < n && rank < 2; i++) {
			if (rank == 0) {
				MPI_Send(buf, sz, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
				MPI_Recv(buf, sz, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else {
				MPI_Recv(buf, sz, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(buf, sz, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
			}
		}
		if (pass)
			bw = 2.0 * n * sz / (MPI_Wtime() - t0) / 1e6;
		else
			lat = (MPI_Wtime() - t0) / (2.0 * n) * 1e6;
	}
	for (int cnt = 1; cnt <= (1 << 18); cnt *= 8) {
		long *in = malloc(cnt * sizeof(long)), *out = malloc(cnt * sizeof(long));

		if (!in || !out)
			MPI_Abort(MPI_COMM_WORLD, 2);
		for (int i = 0; i < cnt; i++)
			in[i] = (long)rank * 1000003 + i;
		MPI_Allreduce(in, out, cnt, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		for (int i = 0; i < cnt; i++) {
			long want = 0;

			for (int r = 0; r < size; r++)
				want += (long)r * 1000003 + i;
			if (out[i] != want) {
				bad++;
				break;
			}
		}
		free(in);
		free(out);
	}
	MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_check: %s: %d ranks, 8 B latency %.2f us, 1 MiB bandwidth "
		       "%.0f MB/s, %d bad\n", all_bad ? "BAD" : "ok", size, lat, bw, all_bad);
	free(buf);
	MPI_Finalize();
	return all_bad != 0;
}
