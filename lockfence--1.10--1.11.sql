/* lockfence: update from 1.10 to 1.11 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.11'" to load this file. \quit
