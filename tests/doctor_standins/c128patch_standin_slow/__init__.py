"""c128patch stand-in for an sglang whose import hangs (tests/test_doctor.py): doctor's probe must give up."""

import time

time.sleep(120)
