"""Wire answers declared once: the server builds them, `threadline_client` reads them.

This package imports nothing of Threadline's own (only pydantic), so both sides of the wire may
depend on it: the client without importing the runtime, the server without importing the client
(tests/unit/test_layering.py holds it to that).
"""

from threadline_wire.send_answer import AdmissionAnswer, fields_doc

__all__ = ["AdmissionAnswer", "fields_doc"]
