// braid-info --device (device_probe.cc).
#pragma once

namespace braid::tools {

// Prints the device braid would use (BRAID_DEVICE), each device's
// properties, and every device-seam call made once and checked, ending at
// the first that fails, which it names with its error. Returns 0 when every
// call passed, 1 when one failed or there is no device.
int printDeviceProbe();

}  // namespace braid::tools
