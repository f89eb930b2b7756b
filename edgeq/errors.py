"""User-facing errors: the CLI prints these as one line; anything else is a bug with a traceback."""

from __future__ import annotations


class EdgeqError(Exception):
    """A problem with the user's input or environment, not a bug in edgeq.

    ``message`` says what is wrong, ``hint`` says what to do about it.
    """

    exit_code: int = 2  # the CLI's exit code: 2 usage/input error, 1 a check or target-side failure

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class GraphError(EdgeqError):
    """The ONNX file cannot be read, is malformed, or cannot be made to fit TensorRT 8.6."""


class QuantError(EdgeqError):
    """Calibration data or quantization settings are unusable."""


class RemoteError(EdgeqError):
    """SSH transport, the target or its agent failed."""


class ReportError(EdgeqError):
    """An engine layer/profile file cannot be parsed."""


class ConfigError(EdgeqError):
    """A target, pipeline or override file is invalid."""


def first_line(e: BaseException) -> str:
    """The first line of a library exception's message, for a one-line error.

    onnx and onnxruntime append C++ context and stack detail after the first line; some exceptions
    carry no message at all, and then the type name is what there is to say.
    """
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
