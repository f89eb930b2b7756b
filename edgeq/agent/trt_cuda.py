"""Device buffers and a CUDA stream for ``profile`` and ``infer``, from whichever CUDA binding the target
has: cuda-python, pycuda, or libcudart through ctypes (JetPack always has the last).

Kept apart from TensorRT code: three interchangeable bindings behind one small interface
(``alloc``, ``sync``, ``handle``, and ``upload`` / ``download`` for ``infer``'s host<->device copies);
each imports its binding only when tried. Copies are synchronous ``cudaMemcpy`` (legacy default
stream): done when the call returns, ordered after the ``sync`` that ends an execution.
"""

from .common import AgentError, load_libcudart


class _CudaPython:
    """cuda-python's runtime API: calls return ``(cudaError_t, value...)`` tuples (TensorRT 8.6
    samples/python/common.py checks ``err != cudart.cudaError_t.cudaSuccess`` the same way)."""

    name = "cuda-python"

    def __init__(self):
        try:
            from cuda import cudart  # cuda-python 11.x/12.x
        except ImportError:
            from cuda.bindings import runtime as cudart  # cuda-python 12.6+ (``cuda.cudart`` gone in 13)
        self._rt = cudart
        try:
            err, self._stream = cudart.cudaStreamCreate()
        except Exception as e:  # a cuda-python built for another CUDA than the driver's
            raise AgentError("cuda", "cuda-python cannot create a stream: %s" % (e,)) from None
        self._check(err, "cudaStreamCreate")
        self.handle = int(self._stream)

    def _check(self, err, what):
        if err != self._rt.cudaError_t.cudaSuccess:
            raise AgentError("cuda", "%s failed: %s" % (what, err))

    def alloc(self, nbytes):
        err, ptr = self._rt.cudaMalloc(nbytes)
        self._check(err, "cudaMalloc(%d)" % nbytes)
        (err,) = self._rt.cudaMemset(ptr, 0, nbytes)
        self._check(err, "cudaMemset")
        return int(ptr)

    def upload(self, ptr, data):
        host = _host_buffer(data)
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        (err,) = self._rt.cudaMemcpy(ptr, _address(host), len(data), kind)
        self._check(err, "cudaMemcpy(HostToDevice, %d)" % len(data))

    def download(self, ptr, nbytes):
        host = _host_buffer(nbytes)
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        (err,) = self._rt.cudaMemcpy(_address(host), ptr, nbytes, kind)
        self._check(err, "cudaMemcpy(DeviceToHost, %d)" % nbytes)
        return host.raw[:nbytes]

    def sync(self):
        (err,) = self._rt.cudaStreamSynchronize(self._stream)
        self._check(err, "cudaStreamSynchronize")


class _PyCuda:
    """pycuda's driver API. ``autoprimaryctx`` (pycuda >= 2021.1) retains and pushes the device's
    primary context, the one TensorRT's runtime API uses; older pycuda only has ``autoinit``, which
    pushes a context of its own that TensorRT then uses too (it is current before the Runtime exists)."""

    name = "pycuda"

    def __init__(self):
        try:
            try:
                import pycuda.autoprimaryctx  # retains and pushes the primary context
            except ImportError:
                import pycuda.autoinit  # noqa: F401 - creates and pushes a context of its own
            import pycuda.driver as cuda
        except ImportError:
            raise
        except Exception as e:  # pycuda._driver.Error: cuInit failed, no device
            raise AgentError("cuda", "pycuda cannot initialise CUDA: %s" % (e,)) from None
        self._cuda = cuda
        self._keep = []
        self._stream = cuda.Stream()
        self.handle = int(self._stream.handle)

    def alloc(self, nbytes):
        buf = self._cuda.mem_alloc(nbytes)
        self._cuda.memset_d8(buf, 0, nbytes)
        self._keep.append(buf)  # a DeviceAllocation frees its memory when collected
        return int(buf)

    def upload(self, ptr, data):
        self._cuda.memcpy_htod(ptr, data)  # dest: a DeviceAllocation or an int pointer (pycuda.driver)

    def download(self, ptr, nbytes):
        host = bytearray(nbytes)
        self._cuda.memcpy_dtoh(host, ptr)  # dest: any writable buffer
        return bytes(host)

    def sync(self):
        self._stream.synchronize()


class _LibCudart:
    """The CUDA runtime library itself through ctypes: JetPack installs libcudart with TensorRT, but
    neither cuda-python nor pycuda. Signatures: CUDA Runtime API (``cudaMalloc(void**, size_t)``, ...)."""

    name = "libcudart"

    def __init__(self):
        import ctypes

        lib = load_libcudart()
        c_int, c_size_t, c_void_p, ptr_t = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER
        for fn, args in (
            ("cudaStreamCreate", [ptr_t(c_void_p)]),
            ("cudaMalloc", [ptr_t(c_void_p), c_size_t]),
            ("cudaMemset", [c_void_p, c_int, c_size_t]),
            ("cudaStreamSynchronize", [c_void_p]),
            ("cudaMemcpy", [c_void_p, c_void_p, c_size_t, c_int]),  # kind: 1 HostToDevice, 2 DeviceToHost
        ):
            getattr(lib, fn).argtypes = args
            getattr(lib, fn).restype = c_int
        lib.cudaGetErrorName.argtypes = [c_int]
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        self._ct = ctypes
        self._lib = lib
        self._stream = c_void_p()
        self._check(lib.cudaStreamCreate(ctypes.byref(self._stream)), "cudaStreamCreate")
        self.handle = int(self._stream.value or 0)

    def _check(self, err, what):
        if err != 0:  # cudaSuccess
            name = (self._lib.cudaGetErrorName(err) or b"?").decode("ascii", "replace")
            text = (self._lib.cudaGetErrorString(err) or b"").decode("utf-8", "replace")
            raise AgentError("cuda", "%s failed: %s (%s)" % (what, name, text))

    def alloc(self, nbytes):
        ptr = self._ct.c_void_p()
        self._check(self._lib.cudaMalloc(self._ct.byref(ptr), nbytes), "cudaMalloc(%d)" % nbytes)
        self._check(self._lib.cudaMemset(ptr, 0, nbytes), "cudaMemset")
        return int(ptr.value)

    def sync(self):
        self._check(self._lib.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    def upload(self, ptr, data):
        host = _host_buffer(data)
        err = self._lib.cudaMemcpy(ptr, _address(host), len(data), 1)
        self._check(err, "cudaMemcpy(HostToDevice, %d)" % len(data))

    def download(self, ptr, nbytes):
        host = _host_buffer(nbytes)
        err = self._lib.cudaMemcpy(_address(host), ptr, nbytes, 2)
        self._check(err, "cudaMemcpy(DeviceToHost, %d)" % nbytes)
        return host.raw[:nbytes]


def _host_buffer(data_or_size):
    """A ctypes char array: a copy of ``data`` (bytes), or ``size`` zero bytes to copy into."""
    import ctypes

    if isinstance(data_or_size, int):
        return (ctypes.c_char * max(1, data_or_size))()
    return (ctypes.c_char * max(1, len(data_or_size))).from_buffer_copy(bytes(data_or_size) or b"\0")


def _address(host):
    import ctypes

    return ctypes.addressof(host)


def open_cuda():
    """Device buffers and a stream from the first CUDA binding that imports: cuda-python, pycuda, or
    libcudart through ctypes. Call it BEFORE creating the TensorRT Runtime, so the engine and the
    buffers live in one CUDA context (each of the three makes the primary context current, except
    pycuda's ``autoinit``, whose context TensorRT then uses too)."""
    errors = []
    for cls in (_CudaPython, _PyCuda, _LibCudart):
        try:
            return cls()
        except ImportError as e:
            errors.append("%s: %s" % (cls.name, e))
    raise AgentError(
        "import",
        "no CUDA runtime to allocate the engine's buffers (tried cuda-python, pycuda, libcudart)",
        details={"hint": "pip install cuda-python, or use backend: trtexec", "errors": errors},
    )
