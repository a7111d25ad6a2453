/*-------------------------------------------------------------------------
 *
 * name_array.c
 *	  A text[] of names turned into validated, byte-sorted, distinct C
 *	  strings: the resources of fence(text[], ...) and try_fence(text[],
 *	  ...) (fence_multi.c), and the names and resources of etcd_lock_many
 *	  and the array forms of etcd_lock_and_fence (etcd_lock_many.c).
 *
 * The order is the bytes' (strcmp), not a collation's, so that every
 * session and database agrees on it: calls that take several fences or
 * locks take them in that order and cannot deadlock with one another.
 *
 * IDENTIFICATION
 *	  src/name_array.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "name_array.h"

/* Where a validation error arose, for its context line. */
typedef struct NameArrayPosition
{
	NameArrayKind kind;
	int			index;			/* 0-based, in array order */
	int			count;
} NameArrayPosition;

static void
name_array_error_context(void *arg)
{
	NameArrayPosition *pos = (NameArrayPosition *) arg;

	if (pos->kind == NAME_ARRAY_LOCK_NAMES)
		errcontext("element %d of %d of the etcd lock name array",
				   pos->index + 1, pos->count);
	else
		errcontext("element %d of %d of the resource array",
				   pos->index + 1, pos->count);
}

/*
 * The elements of a text array (of any dimensions), in array order, each
 * passed to validate; *n gets their number.  An empty or NULL-containing
 * array is refused, and an error an element raises names its position.
 */
char **
name_array_elements(ArrayType *array, NameArrayKind kind,
					NameArrayValidate validate, void *arg, int *n)
{
	Datum	   *elems;
	bool	   *nulls;
	char	  **out;
	NameArrayPosition pos;
	ErrorContextCallback cb;

	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, n);
	if (*n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 kind == NAME_ARRAY_LOCK_NAMES ?
				 errmsg("etcd lock name array must not be empty") :
				 errmsg("fencing resource array must not be empty"),
				 kind == NAME_ARRAY_LOCK_NAMES ?
				 errhint("Pass at least one lock name.") :
				 errhint("Pass at least one resource.")));

	out = palloc(sizeof(char *) * *n);
	pos.kind = kind;
	pos.count = *n;
	cb.callback = name_array_error_context;
	cb.arg = &pos;
	cb.previous = error_context_stack;
	error_context_stack = &cb;
	for (pos.index = 0; pos.index < *n; pos.index++)
	{
		if (nulls[pos.index])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 kind == NAME_ARRAY_LOCK_NAMES ?
					 errmsg("etcd lock name array must not contain nulls") :
					 errmsg("fencing resource array must not contain nulls")));
		out[pos.index] = TextDatumGetCString(elems[pos.index]);
		validate(out[pos.index], arg);
	}
	error_context_stack = cb.previous;
	return out;
}

/* strcmp for qsort and bsearch over an array of C strings */
int
name_array_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/*
 * Sort names (n > 0 of them) by their bytes in place and drop duplicates;
 * returns how many distinct names are left at the front.
 */
int
name_array_sort_unique(char **names, int n)
{
	int			kept = 1;

	qsort(names, n, sizeof(char *), name_array_cmp);
	for (int i = 1; i < n; i++)
		if (strcmp(names[i], names[kept - 1]) != 0)
			names[kept++] = names[i];
	return kept;
}
