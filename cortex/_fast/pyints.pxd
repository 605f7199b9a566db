# cython: language_level=3
"""Python ints in, C integers out (and a presized dict back), fast: the ledger converts 512
token ids per stored event and 256 keys per match.

CPython 3.11 ints below 2**64 have at most three 30-bit digits; exact ints are read from their
digits directly, everything else (other versions, int subclasses, ``__index__`` objects, values
out of range) goes through the C API, which raises the usual errors.
"""

from cpython.buffer cimport PyObject_CheckBuffer
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from *:
    """
    #if PY_VERSION_HEX < 0x030D0000
    #define cortex_new_dict(n) _PyDict_NewPresized(n)
    #else
    #define cortex_new_dict(n) PyDict_New()
    #endif
    """
    dict cortex_new_dict(Py_ssize_t n)  # a dict sized for n items (saves its resizes)

cdef extern from *:
    """
    /* A Python int in [0, 2**64) as uint64_t: -1 with an exception set otherwise. CPython 3.11
       ints below 2**64 have at most three 30-bit digits; those are read directly (match converts
       256 keys per request), everything else goes through the C API. */
    static int cortex_as_u64(PyObject* value, uint64_t* out) {
    #if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
        if (PyLong_CheckExact(value)) {
            const digit* d = ((PyLongObject*)value)->ob_digit;
            switch (Py_SIZE(value)) {
                case 0: *out = 0; return 0;
                case 1: *out = d[0]; return 0;
                case 2: *out = (uint64_t)d[0] | ((uint64_t)d[1] << 30); return 0;
                case 3:
                    if (d[2] < 16) {
                        *out = (uint64_t)d[0] | ((uint64_t)d[1] << 30) | ((uint64_t)d[2] << 60);
                        return 0;
                    }
                    break;
            }
        }
    #endif
        PyObject* index = PyNumber_Index(value);
        if (index == NULL) return -1;
        unsigned long long v = PyLong_AsUnsignedLongLong(index);
        Py_DECREF(index);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        *out = (uint64_t)v;
        return 0;
    }
    """
    int cortex_as_u64(object value, uint64_t* out) except -1


cdef extern from *:
    """
    /* A token id in [0, 2**32) read straight from a CPython 3.11 int (30-bit digits): 1 when
       done, 0 when the value needs the general path (other types, negatives, >= 2**32). */
    static CYTHON_INLINE int cortex_small_token(PyObject* value, uint32_t* out) {
    #if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
        if (PyLong_CheckExact(value)) {
            const digit* d = ((PyLongObject*)value)->ob_digit;
            switch (Py_SIZE(value)) {
                case 0: *out = 0; return 1;
                case 1: *out = (uint32_t)d[0]; return 1;
                case 2: if (d[1] < 4) { *out = (uint32_t)d[0] | ((uint32_t)d[1] << 30); return 1; }
            }
        }
    #endif
        return 0;
    }
    """
    bint cortex_small_token(object value, uint32_t* out) noexcept


cdef inline uint32_t checked_token(object value) except? 0xFFFFFFFF:
    """One token id as u32; ValueError when it lies outside [0, 2**32)."""
    cdef uint32_t token
    if cortex_small_token(value, &token):
        return token
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow != 0 or v < 0 or (v >> 32) != 0:
        raise ValueError(f"token id {value!r} outside [0, 2**32)")
    return <uint32_t>v


cdef inline int copy_tokens(object token_ids, uint32_t* out, Py_ssize_t count) except -1:
    """Copy the first ``count`` token ids (a list, any sequence, or a buffer of uint32) into
    ``out``, checking each one. The caller checked ``len(token_ids) >= count``."""
    cdef const uint32_t[::1] view
    cdef Py_ssize_t i
    if type(token_ids) is list:
        for i in range(count):
            out[i] = checked_token((<list>token_ids)[i])
        return 0
    if PyObject_CheckBuffer(token_ids):
        try:
            view = token_ids
        except (ValueError, TypeError):
            pass  # a buffer of another item type: read it as a sequence below
        else:
            if count:
                memcpy(out, &view[0], 4 * <size_t>count)
            return 0
    for i in range(count):
        out[i] = checked_token(token_ids[i])
    return 0


cdef inline int copy_u64s(object values, uint64_t* out, Py_ssize_t count) except -1:
    """Copy the first ``count`` ints in [0, 2**64) (a list, any sequence, or a buffer of uint64)
    into ``out`` (OverflowError / TypeError for anything else)."""
    cdef const uint64_t[::1] view
    cdef Py_ssize_t i
    if type(values) is list:
        for i in range(count):
            cortex_as_u64((<list>values)[i], &out[i])
        return 0
    if PyObject_CheckBuffer(values):
        try:
            view = values
        except (ValueError, TypeError):
            pass  # a buffer of another item type: read it as a sequence below
        else:
            if count:
                memcpy(out, &view[0], count * sizeof(uint64_t))
            return 0
    for i in range(count):
        cortex_as_u64(values[i], &out[i])
    return 0
