"""c128patch stand-in for an importable sglang (tests/test_doctor.py): a real install cannot import
on this CPU machine (no torch, no GPU stack), so doctor's probe is pointed here to show what it says
about a Python where sglang imports. Not sglang: only the parser shape doctor calls."""
