/* SPDX-License-Identifier: MIT */
/* A minimal intrusive doubly-linked list. */
#ifndef URDMA_LIST_H
#define URDMA_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct list_head {
	struct list_head *next, *prev;
};

#define LIST_HEAD_INIT(name) { &(name), &(name) }

static inline void list_init(struct list_head *h)
{
	h->next = h->prev = h;
}
static inline bool list_empty(const struct list_head *h)
{
	return h->next == h;
}
static inline void list_add_tail(struct list_head *n, struct list_head *h)
{
	n->prev = h->prev;
	n->next = h;
	h->prev->next = n;
	h->prev = n;
}
static inline void list_del(struct list_head *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->next = n->prev = n;
}

/* Make n the first entry of the list at h (a rotation). */
static inline void list_rotate_to(struct list_head *h, struct list_head *n)
{
	list_del(h);
	list_add_tail(h, n);
}

#define list_entry(ptr, type, member)                                          \
	((type *)((char *)(ptr) - offsetof(type, member)))
#define list_for_each_entry(pos, head, member)                                 \
	for (pos = list_entry((head)->next, __typeof__(*pos), member);         \
	     &pos->member != (head);                                           \
	     pos = list_entry(pos->member.next, __typeof__(*pos), member))
#define list_for_each_entry_safe(pos, n, head, member)                         \
	for (pos = list_entry((head)->next, __typeof__(*pos), member),         \
	    n = list_entry(pos->member.next, __typeof__(*pos), member);        \
	     &pos->member != (head);                                           \
	     pos = n, n = list_entry(n->member.next, __typeof__(*n), member))

#endif
