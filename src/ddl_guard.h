/*-------------------------------------------------------------------------
 *
 * ddl_guard.h
 *	  The DDL guards' module initialization (ddl_guard.c).
 *
 * IDENTIFICATION
 *	  src/ddl_guard.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_DDL_GUARD_H
#define LOCKFENCE_DDL_GUARD_H

extern void ddl_guard_init(void);

#endif							/* LOCKFENCE_DDL_GUARD_H */
