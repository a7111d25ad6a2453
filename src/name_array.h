/*-------------------------------------------------------------------------
 *
 * name_array.h
 *	  A text[] of names (fencing resources, etcd lock names) turned into
 *	  validated, byte-sorted, distinct C strings (name_array.c).
 *
 * IDENTIFICATION
 *	  src/name_array.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_NAME_ARRAY_H
#define LOCKFENCE_NAME_ARRAY_H

#include "utils/array.h"

/* What the array holds: chooses its error messages. */
typedef enum NameArrayKind
{
	NAME_ARRAY_RESOURCES,		/* fencing resources */
	NAME_ARRAY_LOCK_NAMES		/* etcd lock names */
} NameArrayKind;

/* Raises the error for an invalid element; arg is the caller's. */
typedef void (*NameArrayValidate) (const char *name, void *arg);

extern char **name_array_elements(ArrayType *array, NameArrayKind kind,
								  NameArrayValidate validate, void *arg,
								  int *n);
extern int	name_array_sort_unique(char **names, int n);
extern int	name_array_cmp(const void *a, const void *b);

#endif							/* LOCKFENCE_NAME_ARRAY_H */
