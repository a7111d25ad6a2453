/*-------------------------------------------------------------------------
 *
 * wait_timeout.h
 *	  The wait_timeout argument of the waiting lock and lease calls
 *	  (wait_timeout.c).
 *
 * IDENTIFICATION
 *	  src/wait_timeout.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_WAIT_TIMEOUT_H
#define LOCKFENCE_WAIT_TIMEOUT_H

#include "datatype/timestamp.h"

/* wait_timeout_usecs' answer for a wait without limit */
#define WAIT_TIMEOUT_FOREVER	((int64) -1)

extern bool wait_timeout_usecs(const Interval *span, int64 *usecs);
extern long wait_ms_until(TimestampTz deadline);

#endif							/* LOCKFENCE_WAIT_TIMEOUT_H */
