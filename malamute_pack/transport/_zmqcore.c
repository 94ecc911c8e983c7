/*
 * The compiled core of the broker's ZeroMQ I/O: whole messages received
 * and sent in one call each, with no Python object per frame beyond its
 * bytes. pyzmq costs a Python call (and, on receipt, a frame object) per
 * frame; the broker sends and receives every message, so those calls were
 * half its reactor thread's time.
 *
 It works on a socket pyzmq opened, through its handle (Socket.underlying),
 * after checking that pyzmq has not closed it (Socket.closed), and never
 * closes it; errors are raised as pyzmq raises them (zmq.ZMQError with the
 * error number). malamute_pack/transport/zmqcore.py chooses this module or
 * its pure-Python twin, which behaves the same. The calls never block
 * (ZMQ_DONTWAIT) and keep the GIL: releasing it for a non-blocking call
 * would let another thread take it for a whole switch interval.
 *
 * Tests: tests/unit/test_transport_zmqcore.py (both builds).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <zmq.h>

static PyObject *ZMQError;    /* zmq.error.ZMQError */
static PyObject *closed_name; /* "closed" */
static PyObject *handle_name; /* "underlying" */
static PyObject *empty;       /* b"" */

static void
raise_zmq(int error)
{
    PyObject *exc = PyObject_CallFunction(ZMQError, "i", error);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* The libzmq socket of the pyzmq socket obj; NULL with an error set if closed. */
static void *
socket_of(PyObject *obj)
{
    PyObject *closed = PyObject_GetAttr(obj, closed_name);
    if (closed == NULL)
        return NULL;
    int is_closed = PyObject_IsTrue(closed);
    Py_DECREF(closed);
    if (is_closed < 0)
        return NULL;
    if (is_closed) {
        raise_zmq(ENOTSOCK);
        return NULL;
    }
    PyObject *handle = PyObject_GetAttr(obj, handle_name);
    if (handle == NULL)
        return NULL;
    void *sock = PyLong_AsVoidPtr(handle);
    Py_DECREF(handle);
    if (sock == NULL && !PyErr_Occurred())
        raise_zmq(ENOTSOCK);
    return sock;
}

/* The frame just received in msg, as bytes. */
static PyObject *
frame_bytes(zmq_msg_t *msg)
{
    return PyBytes_FromStringAndSize((const char *)zmq_msg_data(msg), (Py_ssize_t)zmq_msg_size(msg));
}

/*
 * One whole message from sock, appended to batch: 1 when it was, 0 when
 * none waits (EAGAIN), -1 with *error set to ZeroMQ's error, -2 with a
 * Python error set. With identified, the message starts with the user
 * ZeroMQ's authentication (ZAP) gave its connection (b"" if none): the
 * metadata of the frame after the routing id.
 */
static int
receive_one(void *sock, PyObject *batch, int identified, int *error)
{
    PyObject *frames = NULL;
    zmq_msg_t msg;
    for (Py_ssize_t k = 0;; k++) {
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&msg);
            /* ZeroMQ delivers whole messages: only the first frame can be missing. */
            Py_XDECREF(frames);
            if (k == 0 && e == EAGAIN)
                return 0;
            *error = e;
            return -1;
        }
        if (frames == NULL) {
            frames = PyList_New(0);
            if (frames == NULL || (identified && PyList_Append(frames, empty) < 0))
                goto failed;
        }
        if (identified && k == 1) {
            const char *user = zmq_msg_gets(&msg, "User-Id");
            if (user != NULL) {
                PyObject *name = PyBytes_FromString(user);
                if (name == NULL)
                    goto failed;
                PyList_SET_ITEM(frames, 0, name); /* steals name's reference */
                Py_DECREF(empty);                 /* the one the list held */
            }
        }
        int more = zmq_msg_more(&msg);
        PyObject *frame = frame_bytes(&msg);
        zmq_msg_close(&msg);
        if (frame == NULL) {
            Py_DECREF(frames);
            return -2;
        }
        int appended = PyList_Append(frames, frame);
        Py_DECREF(frame);
        if (appended < 0) {
            Py_DECREF(frames);
            return -2;
        }
        if (!more)
            break;
    }
    int appended = PyList_Append(batch, frames);
    Py_DECREF(frames);
    return appended < 0 ? -2 : 1;
failed:
    zmq_msg_close(&msg);
    Py_XDECREF(frames);
    return -2;
}

/*
 * Up to limit whole messages, each a list of its frames' bytes, until none
 * waits (EAGAIN). Another error is raised, unless messages came before it:
 * they are returned, and the next call meets it.
 */
static PyObject *
receive_batch(PyObject *args, int identified)
{
    PyObject *obj;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "On", &obj, &limit))
        return NULL;
    void *sock = socket_of(obj);
    if (sock == NULL)
        return NULL;
    PyObject *batch = PyList_New(0);
    if (batch == NULL)
        return NULL;
    int error = 0;
    for (Py_ssize_t n = 0; n < limit; n++) {
        int got = receive_one(sock, batch, identified, &error);
        if (got == 1)
            continue;
        if (got == -2) {
            Py_DECREF(batch);
            return NULL;
        }
        break;
    }
    if (error && PyList_GET_SIZE(batch) == 0) {
        Py_DECREF(batch);
        raise_zmq(error);
        return NULL;
    }
    return batch;
}

/* recv_batch(socket, limit) -> messages */
static PyObject *
recv_batch(PyObject *self, PyObject *args)
{
    return receive_batch(args, 0);
}

/* recv_identified_batch(socket, limit) -> messages, each with its user first */
static PyObject *
recv_identified_batch(PyObject *self, PyObject *args)
{
    return receive_batch(args, 1);
}

/*
 * send_message(socket, first, rest): first, then the frames of the
 * sequence rest, as one message; the error of a send that failed is
 * raised (only the first frame can fail for a full queue or an unknown
 * peer: ZeroMQ queues whole messages).
 */
static PyObject *
send_message(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_buffer first;
    PyObject *rest;
    if (!PyArg_ParseTuple(args, "Oy*O:send_message", &obj, &first, &rest))
        return NULL;
    PyObject *frames = PySequence_Fast(rest, "rest must be a sequence of bytes");
    if (frames == NULL) {
        PyBuffer_Release(&first);
        return NULL;
    }
    void *sock = socket_of(obj);
    int error = 0;
    if (sock == NULL)
        goto failed;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(frames);
    PyObject **items = PySequence_Fast_ITEMS(frames);
    /* Every frame checked before the first goes: a message is sent whole or
       not at all. Frames are bytes, or anything else with a buffer (as pyzmq
       takes them). */
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!PyBytes_Check(items[i]) && !PyObject_CheckBuffer(items[i])) {
            PyErr_Format(PyExc_TypeError, "frame %zd is %.100s, not bytes", i + 1, Py_TYPE(items[i])->tp_name);
            goto failed;
        }
    }
    int flags = count ? ZMQ_DONTWAIT | ZMQ_SNDMORE : ZMQ_DONTWAIT;
    if (zmq_send(sock, first.buf, (size_t)first.len, flags) < 0) {
        error = zmq_errno();
    } else {
        for (Py_ssize_t i = 0; i < count && !error; i++) {
            flags = i + 1 < count ? ZMQ_DONTWAIT | ZMQ_SNDMORE : ZMQ_DONTWAIT;
            PyObject *item = items[i];
            int sent;
            if (PyBytes_Check(item)) {
                sent = zmq_send(sock, PyBytes_AS_STRING(item), (size_t)PyBytes_GET_SIZE(item), flags);
            } else {
                Py_buffer view;
                if (PyObject_GetBuffer(item, &view, PyBUF_SIMPLE) < 0) {
                    /* Checked above: only an exporter that changed its mind gets
                       here, and the message is already part sent, as pyzmq's
                       would be. */
                    goto failed;
                }
                sent = zmq_send(sock, view.buf, (size_t)view.len, flags);
                PyBuffer_Release(&view);
            }
            if (sent < 0)
                error = zmq_errno();
        }
    }
    PyBuffer_Release(&first);
    Py_DECREF(frames);
    if (error) {
        raise_zmq(error);
        return NULL;
    }
    Py_RETURN_NONE;
failed:
    PyBuffer_Release(&first);
    Py_DECREF(frames);
    return NULL;
}

static PyMethodDef methods[] = {
    {"recv_batch", recv_batch, METH_VARARGS, "Up to limit whole messages waiting on socket."},
    {"recv_identified_batch", recv_identified_batch, METH_VARARGS,
     "As recv_batch, each message preceded by the user its connection authenticated as."},
    {"send_message", send_message, METH_VARARGS, "Send first, then the frames of rest, as one message."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "malamute_pack.transport._zmqcore",
    "The compiled core of the broker's ZeroMQ I/O (see malamute_pack.transport.zmqcore).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__zmqcore(void)
{
    PyObject *errors = PyImport_ImportModule("zmq.error");
    if (errors == NULL)
        return NULL;
    ZMQError = PyObject_GetAttrString(errors, "ZMQError");
    Py_DECREF(errors);
    if (ZMQError == NULL)
        return NULL;
    closed_name = PyUnicode_InternFromString("closed");
    handle_name = PyUnicode_InternFromString("underlying");
    empty = PyBytes_FromStringAndSize(NULL, 0);
    if (closed_name == NULL || handle_name == NULL || empty == NULL)
        return NULL;
    return PyModule_Create(&module);
}
