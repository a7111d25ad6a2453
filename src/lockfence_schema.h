/*-------------------------------------------------------------------------
 *
 * lockfence_schema.h
 *	  The extension's schema and its tables, looked up by name
 *	  (lockfence_schema.c).
 *
 * IDENTIFICATION
 *	  src/lockfence_schema.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_SCHEMA_H
#define LOCKFENCE_SCHEMA_H

extern Oid	lockfence_schema_oid(void);
extern Oid	lockfence_relid(const char *relname);

#endif							/* LOCKFENCE_SCHEMA_H */
