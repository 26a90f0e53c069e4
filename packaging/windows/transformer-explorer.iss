; Inno Setup 6 script: a per-user installer for the PyInstaller folder dist\transformer-explorer\.
; Build the folder first (docs/packaging.md), then:  ISCC.exe packaging\windows\transformer-explorer.iss
#define AppName "Transformer Explorer"
#define AppVersion "0.1.0"
#define AppExe "transformer-explorer.exe"
#define Root "..\.."

[Setup]
AppId={{6F4C2B1E-8D2A-4F51-9B7C-3E0A5D9C7A41}
AppName={#AppName}
AppVersion={#AppVersion}
AppPublisher=Transformer Explorer contributors
DefaultDirName={localappdata}\Programs\Transformer Explorer
DefaultGroupName={#AppName}
PrivilegesRequired=lowest
OutputDir={#Root}\dist\installer
OutputBaseFilename=TransformerExplorer-Setup-{#AppVersion}
SetupIconFile={#Root}\resources\icons\transformer-explorer.ico
UninstallDisplayIcon={app}\{#AppExe}
Compression=lzma2/max
SolidCompression=yes
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
WizardStyle=modern

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#Root}\dist\transformer-explorer\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\{#AppName}"; Filename: "{app}\{#AppExe}"
Name: "{group}\Uninstall {#AppName}"; Filename: "{uninstallexe}"
Name: "{userdesktop}\{#AppName}"; Filename: "{app}\{#AppExe}"; Tasks: desktopicon

[Run]
Filename: "{app}\{#AppExe}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent
