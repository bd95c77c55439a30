//go:build !linux

package pgserver

// orphanModes are the ways a server dies with its process on this OS: the
// watchdog on macOS and the BSDs, the job object on Windows.
var orphanModes = map[string]func(){
	"Default": func() {},
}
