"""The runtime frame: what the simulator and the real runtime share around the controller.

::

    controller (pure)  <-- EventPump.pump() -- inbox <-- events a runtime reports
         |                                                    ^
         | actions                                            |
         v                                                    |
    SimRuntime / DeviceExecutor: *how* an action happens (SimPy timeouts, remote calls)
         |  Hosting: each unit's  home -> lending -> lent -> reclaiming -> home
         |  Recorder: every device's activity as intervals tiling [0, wall]
         v
    RunResult: one result type (one set of names, one ledger audit) for both worlds

A runtime never calls the controller from ``execute``: it ``deliver``s events to the pump,
and the pump drains them once the runtime's own callback is done.
"""
