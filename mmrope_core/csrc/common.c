/* Buffers, and threads started and joined within a call. */
#include "native.h"

#include <pthread.h>

/* Run `task` on each of `workers` work items (`size` bytes apart): the first on this thread,
 * the others on threads started for this call and joined before it returns, so nothing lingers
 * (data-loader workers fork). A thread that cannot be started leaves its item to this thread. */
void
run_workers(void *(*task)(void *), void *items, size_t size, Py_ssize_t workers)
{
    pthread_t started[MAX_THREADS];
    int running[MAX_THREADS] = {0};
    for (Py_ssize_t w = 1; w < workers; w++)
        running[w] = pthread_create(&started[w], NULL, task, (char *)items + w * size) == 0;
    task(items);
    for (Py_ssize_t w = 1; w < workers; w++) {
        if (running[w])
            pthread_join(started[w], NULL);
        else
            task((char *)items + w * size);
    }
}

/* How many workers share `items` cut into `parts` (rows of a batch, rows of the output). */
Py_ssize_t
worker_count(Py_ssize_t items, Py_ssize_t parts, int threads)
{
    Py_ssize_t workers = items / ITEMS_PER_THREAD;
    if (workers > threads)
        workers = threads;
    if (workers > parts)
        workers = parts;
    if (workers > MAX_THREADS)
        workers = MAX_THREADS;
    return workers < 1 ? 1 : workers;
}

Py_ssize_t
split_rows(RowRange *ranges, Py_ssize_t batch, Py_ssize_t length, int threads)
{
    const Py_ssize_t workers = worker_count(batch * length, batch, threads);
    for (Py_ssize_t w = 0; w < workers; w++)
        ranges[w] = (RowRange){batch * w / workers, batch * (w + 1) / workers};
    return workers;
}

int
acquire(PyObject *object, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *name)
{
    if (PyObject_GetBuffer(object, view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items", name, view->len, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* What the readings take: a (B, L) input of `itemsize`-byte items and the (B, L) bytes they
 * write, both acquired and checked; on failure neither is held. */
int
acquire_reading(const char *name, PyObject *input_obj, Py_ssize_t itemsize, PyObject *output_obj,
                Py_ssize_t batch, Py_ssize_t length, Py_buffer *input, Py_buffer *output)
{
    if (acquire(input_obj, input, 0, itemsize, name) < 0)
        return -1;
    if (acquire(output_obj, output, 1, 1, name) < 0) {
        PyBuffer_Release(input);
        return -1;
    }
    if (batch < 0 || length < 0 || input->len != batch * length * itemsize || output->len != batch * length) {
        PyErr_Format(PyExc_ValueError, "%s: sizes do not fit a batch of %zd x %zd: input %zd bytes, output %zd",
                     name, batch, length, input->len, output->len);
        PyBuffer_Release(output);
        PyBuffer_Release(input);
        return -1;
    }
    return 0;
}
