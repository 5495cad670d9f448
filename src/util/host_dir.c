// SPDX-License-Identifier: MIT
/* The user's host directory: util/host_dir.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/host_dir.h"

void urdma_host_dir_path(char *buf, size_t len)
{
	const char *env = getenv("URDMA_SHM_DIR");

	if (env && *env)
		snprintf(buf, len, "%s", env);
	else
		snprintf(buf, len, "/dev/shm/urdma-%u", (unsigned)geteuid());
}

int urdma_private_dir_open(const char *path, struct stat *st)
{
	int fd;

	if (mkdir(path, 0700) && errno != EEXIST)
		return -errno;
	fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, st) || st->st_uid != geteuid() || (st->st_mode & 022)) {
		close(fd);
		return -EPERM;
	}
	return fd;
}
