"""What the end-to-end interop references share: gclab's command line, and gclab's output held to the reference's
to float32 rounding (relative to the reference's largest magnitude)."""
import subprocess

TOL = 1e-5


def compare(what, ours, ref, tol=TOL):
    if ours.shape != ref.shape:
        raise SystemExit(f"{what}: gclab's shape {tuple(ours.shape)}, diffusers' {tuple(ref.shape)}")
    err = ((ours - ref).abs().max() / ref.abs().max()).item()
    print(f"{what}: max |gclab - diffusers| / max |diffusers| = {err:.2e}")
    if not err < tol:
        raise SystemExit(f"{what}: gclab differs from diffusers ({err:.2e} >= {tol:.0e})")


def gclab(exe, *args):
    r = subprocess.run([exe, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gclab {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout
